package testutil

import (
	"testing"

	"go.uber.org/goleak"
)

// VerifyNoLeaks runs a package's tests and then fails the run if any goroutine they started is
// still running: every goroutine belongs to an owner that stops it (Close, or the end of Run's
// context) and waits for it. Call it from TestMain:
//
//	func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
//
// Goroutines of libraries that live for the whole process by design are ignored.
func VerifyNoLeaks(m *testing.M) {
	goleak.VerifyTestMain(m,
		// OpenTelemetry's and klog's process-wide background workers.
		goleak.IgnoreAnyFunction("go.opentelemetry.io/otel/sdk/trace.(*batchSpanProcessor).processQueue"),
		goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	)
}
