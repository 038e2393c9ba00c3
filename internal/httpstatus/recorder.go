package httpstatus

import "net/http"

// Recorder is an http.ResponseWriter that remembers the status code written through it.
type Recorder struct {
	http.ResponseWriter
	// Status is the code the handler wrote; http.StatusOK until it calls WriteHeader.
	Status int
}

// NewRecorder wraps w.
func NewRecorder(w http.ResponseWriter) *Recorder {
	return &Recorder{ResponseWriter: w, Status: http.StatusOK}
}

// WriteHeader records code and writes it to the underlying writer.
func (r *Recorder) WriteHeader(code int) {
	r.Status = code
	r.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the underlying writer (flushes, deadlines).
func (r *Recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
