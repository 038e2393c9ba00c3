package bench

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// TestHold: a held worker process says it is ready, then waits for its line; without one it fails
// instead of running its timed steps.
func TestHold(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- hold(&out, pr) }()
	select {
	case err := <-done:
		t.Fatalf("hold returned %v before its line", err)
	default:
	}
	if _, err := io.WriteString(pw, "go\n"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if out.String() != holdReady+"\n" {
		t.Errorf("hold wrote %q, want %q", out.String(), holdReady+"\n")
	}
	if err := hold(io.Discard, strings.NewReader("")); err == nil || !strings.Contains(err.Error(), "no line to go on") {
		t.Errorf("hold with its input closed: %v", err)
	}
}
