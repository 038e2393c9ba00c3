package store

// SetAfterOpen sets the fault point between opening a bucket and reading its status (nil: none).
func SetAfterOpen(fn func(bucket string)) { afterOpen = fn }

// SetOnStoreRace sets what runs when a job's stream is about to be created again after a server
// failed to create its store (nil: nothing).
func SetOnStoreRace(fn func(stream string)) { onStoreRace = fn }
