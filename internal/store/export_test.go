package store

// SetAfterOpen sets the fault point between opening a bucket and reading its status (nil: none).
func SetAfterOpen(fn func(bucket string)) { afterOpen = fn }
