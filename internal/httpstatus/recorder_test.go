package httpstatus_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fanin-ml/fanin/internal/httpstatus"
)

func TestRecorderKeepsTheStatus(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		want    int
	}{
		{"body only", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }, http.StatusOK},
		{"written code", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }, http.StatusTeapot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			rec := httpstatus.NewRecorder(w)
			tc.handler(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			if rec.Status != tc.want || w.Code != tc.want {
				t.Fatalf("recorded %d, sent %d, want %d", rec.Status, w.Code, tc.want)
			}
		})
	}
}

// A handler behind the recorder still reaches the underlying writer's Flush.
func TestRecorderUnwraps(t *testing.T) {
	w := httptest.NewRecorder()
	if err := http.NewResponseController(httpstatus.NewRecorder(w)).Flush(); err != nil {
		t.Fatal(err)
	}
	if !w.Flushed {
		t.Fatal("the underlying writer was not flushed")
	}
}
