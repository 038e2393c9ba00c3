// Command libfanin is the Go SDK as a C library, for workers in other languages: the Python package
// (sdk/python) loads it with ctypes, so that the Go SDK stays the one implementation of the
// protocol. Build it with
//
//	go build -buildmode=c-shared -o libfanin.so ./sdk/libfanin
//
// which also writes libfanin.h. The ABI (docs/PYTHON.md):
//
//   - Objects are handles (uint64, never 0): a client from fanin_connect, a worker from
//     fanin_worker, an elastic worker from fanin_elastic (elastic.go), a reference from
//     fanin_reference (reference.go), an applied-order record from fanin_applied_watch
//     (applied.go). Each is released by its close function; using a closed handle is an error, not
//     a crash.
//   - Every call that can fail returns 0 on success and sets *err to NULL, or returns non-zero and
//     sets *err to a JSON document {"kind", "message", and for a rejection "reason", "shard",
//     "rank", "step"} that the caller frees with fanin_free. kind is "rejected" (the wire's reason
//     in "reason", docs/PROTOCOL.md), "timeout", "unknown_job", "uploaded" (fanin_upload: the
//     initial parameters are stored already) or "error".
//   - Float buffers belong to the caller. Gradients are only read during the call. A worker's
//     parameter buffer, given to fanin_worker, receives the parameters straight from the network
//     during fanin_params and fanin_step and is not touched between calls: it must stay allocated
//     until fanin_worker_close. An elastic worker's two buffers (parameters after a step, and the
//     parameters a gradient is computed from) likewise, until fanin_elastic_close.
//   - Calls block; they release nothing of the caller's (ctypes drops the GIL around them), so
//     several threads may use one client, and one worker per thread.
//   - timeout_ms <= 0 waits without limit.
package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"time"
	"unsafe"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

func main() {}

// handles maps the ABI's handles to their objects. cgo.Handle would do, but a handle used after
// its close would then crash the caller's process; a map lets that be an error.
var handles struct {
	sync.Mutex
	next uint64
	objs map[uint64]any
}

func put(v any) C.uint64_t {
	handles.Lock()
	defer handles.Unlock()
	if handles.objs == nil {
		handles.objs = map[uint64]any{}
	}
	handles.next++
	handles.objs[handles.next] = v
	return C.uint64_t(handles.next)
}

func get[T any](h C.uint64_t) (T, error) {
	handles.Lock()
	defer handles.Unlock()
	v, ok := handles.objs[uint64(h)].(T)
	if !ok {
		var zero T
		return zero, fmt.Errorf("handle %d is not an open %T (closed already?)", uint64(h), zero)
	}
	return v, nil
}

func drop(h C.uint64_t) any {
	handles.Lock()
	defer handles.Unlock()
	v := handles.objs[uint64(h)]
	delete(handles.objs, uint64(h))
	return v
}

// worker is a worker handle's object: the SDK worker (writing into the caller's buffer).
type worker struct {
	*sdk.Worker
	busy sync.Mutex // held by the call using the worker: a second one at once is refused
}

// acquire takes the worker of handle h for one call (an SDK worker is not safe for concurrent
// use); the caller releases it with w.busy.Unlock.
func acquire(h C.uint64_t) (*worker, error) {
	w, err := get[*worker](h)
	if err != nil {
		return nil, err
	}
	if !w.busy.TryLock() {
		return nil, fmt.Errorf("worker of rank %d is in use by another call", w.Rank())
	}
	return w, nil
}

// errDoc is the JSON of *err.
type errDoc struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Reason  string `json:"reason,omitempty"`
	Shard   *int   `json:"shard,omitempty"`
	Rank    *int   `json:"rank,omitempty"`
	Step    int64  `json:"step,omitempty"`
}

// fail sets *out to err's document and returns the status.
func fail(out **C.char, err error) C.int {
	d := errDoc{Kind: "error", Message: err.Error()}
	var rej *wire.Reject
	switch {
	case errors.As(err, &rej):
		d.Kind, d.Reason, d.Step = "rejected", string(rej.Reason), rej.Step
		if rej.Reason == wire.ReasonUnknownJob {
			d.Kind = "unknown_job"
		}
		if rej.Shard >= 0 {
			d.Shard = &rej.Shard
		}
		if rej.Rank >= 0 {
			d.Rank = &rej.Rank
		}
	case errors.Is(err, context.DeadlineExceeded):
		d.Kind = "timeout"
	case errors.Is(err, sdk.ErrUploaded):
		d.Kind = "uploaded"
	}
	if out != nil {
		b, _ := json.Marshal(d)
		*out = C.CString(string(b))
	}
	return 1
}

func ok(out **C.char) C.int {
	if out != nil {
		*out = nil
	}
	return 0
}

func deadline(ms C.int64_t) (context.Context, context.CancelFunc) {
	if ms <= 0 {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeout(context.Background(), time.Duration(ms)*time.Millisecond)
}

// floats is the caller's buffer of n floats as a slice (no copy).
func floats(p *C.float, n C.int64_t) ([]float32, error) {
	if n < 0 || (p == nil && n > 0) {
		return nil, fmt.Errorf("bad buffer: %d floats at %p", int64(n), p)
	}
	if n == 0 {
		return []float32{}, nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(p)), int(n)), nil
}

//export fanin_free
func fanin_free(p *C.char) { C.free(unsafe.Pointer(p)) }

// fanin_connect dials NATS at url. credentials is a job's credentials as the gateway returns them
// (JSON with "jwt", "seed", "inbox_prefix"), or NULL/"" for a server without authentication.
//
//export fanin_connect
func fanin_connect(url, credentials *C.char, timeoutMs C.int64_t, out *C.uint64_t, err **C.char) C.int {
	var opts []sdk.Option
	if credentials != nil && C.GoString(credentials) != "" {
		var cr api.Credentials
		if e := json.Unmarshal([]byte(C.GoString(credentials)), &cr); e != nil {
			return fail(err, fmt.Errorf("credentials are not the gateway's JSON: %w", e))
		}
		opts = append(opts, sdk.WithJobCredentials(&cr))
	}
	ctx, cancel := deadline(timeoutMs)
	defer cancel()
	c, e := sdk.Connect(ctx, C.GoString(url), opts...)
	if e != nil {
		return fail(err, e)
	}
	*out = put(c)
	return ok(err)
}

//export fanin_client_close
func fanin_client_close(h C.uint64_t) {
	if c, isClient := drop(h).(*sdk.Client); isClient {
		c.Close()
	}
}

// fanin_job sets *record to the job's record as JSON (spec and shard layout); free it with
// fanin_free.
//
//export fanin_job
func fanin_job(h C.uint64_t, id *C.char, timeoutMs C.int64_t, record **C.char, err **C.char) C.int {
	c, e := get[*sdk.Client](h)
	if e != nil {
		return fail(err, e)
	}
	ctx, cancel := deadline(timeoutMs)
	defer cancel()
	rec, e := c.Job(ctx, C.GoString(id))
	if e != nil {
		return fail(err, e)
	}
	b, e := json.Marshal(rec)
	if e != nil {
		return fail(err, e)
	}
	*record = C.CString(string(b))
	return ok(err)
}

// fanin_upload uploads a job's initial parameters (init "upload"): n floats, every parameter.
//
//export fanin_upload
func fanin_upload(h C.uint64_t, id *C.char, params *C.float, n C.int64_t, timeoutMs C.int64_t, err **C.char) C.int {
	c, e := get[*sdk.Client](h)
	if e != nil {
		return fail(err, e)
	}
	p, e := floats(params, n)
	if e != nil {
		return fail(err, e)
	}
	ctx, cancel := deadline(timeoutMs)
	defer cancel()
	if e := c.UploadParams(ctx, C.GoString(id), p); e != nil {
		return fail(err, e)
	}
	return ok(err)
}

// fanin_worker joins job id as rank. params (n floats, every parameter of the job) receives the
// parameters; weight > 0 sets the rank's weight (fedavg), 0 leaves it unweighted.
//
//export fanin_worker
func fanin_worker(h C.uint64_t, id *C.char, rank C.int, weight C.double, params *C.float, n C.int64_t, timeoutMs C.int64_t, out *C.uint64_t, err **C.char) C.int {
	return fanin_worker_dtype(h, id, rank, weight, nil, params, n, timeoutMs, out, err)
}

// fanin_worker_dtype is fanin_worker publishing the gradients as dtype: "f32" (or NULL), "bf16"
// or "f16" (sdk.WithGradDtype: fanin_step's float32 gradients are rounded to nearest even into a
// buffer the worker reuses).
//
//export fanin_worker_dtype
func fanin_worker_dtype(h C.uint64_t, id *C.char, rank C.int, weight C.double, dtype *C.char, params *C.float, n C.int64_t, timeoutMs C.int64_t, out *C.uint64_t, err **C.char) C.int {
	c, e := get[*sdk.Client](h)
	if e != nil {
		return fail(err, e)
	}
	p, e := floats(params, n)
	if e != nil {
		return fail(err, e)
	}
	opts := []sdk.WorkerOption{sdk.WithParamsBuffer(p)}
	if weight != 0 {
		opts = append(opts, sdk.WithWeight(float64(weight)))
	}
	if dtype != nil {
		dt, ok := wire.ParseDtype(C.GoString(dtype))
		if !ok {
			return fail(err, wire.Rejectf(wire.ReasonBadDtype, "gradient dtype %q is not %s, %s or %s", C.GoString(dtype), wire.DtypeF32, wire.DtypeBF16, wire.DtypeF16))
		}
		opts = append(opts, sdk.WithGradDtype(dt))
	}
	ctx, cancel := deadline(timeoutMs)
	defer cancel()
	w, e := c.Worker(ctx, C.GoString(id), int(rank), opts...)
	if e != nil {
		return fail(err, e)
	}
	*out = put(&worker{Worker: w})
	return ok(err)
}

// fanin_worker_close closes a worker; a call still using it ends first.
//
//export fanin_worker_close
func fanin_worker_close(h C.uint64_t) {
	if w, isWorker := drop(h).(*worker); isWorker {
		w.busy.Lock()
		_ = w.Close()
		w.busy.Unlock()
	}
}

// fanin_params fetches the current parameters into the worker's buffer and sets *step to their
// step (late or restarted workers).
//
//export fanin_params
func fanin_params(h C.uint64_t, timeoutMs C.int64_t, step *C.int64_t, err **C.char) C.int {
	w, e := acquire(h)
	if e != nil {
		return fail(err, e)
	}
	defer w.busy.Unlock()
	ctx, cancel := deadline(timeoutMs)
	defer cancel()
	t, _, e := w.Params(ctx)
	if e != nil {
		return fail(err, e)
	}
	*step = C.int64_t(t)
	return ok(err)
}

// fanin_step publishes the rank's gradient (n floats) for the next step, waits for the parameters
// after it in the worker's buffer, and sets *step to that step.
//
//export fanin_step
func fanin_step(h C.uint64_t, grads *C.float, n C.int64_t, timeoutMs C.int64_t, step *C.int64_t, err **C.char) C.int {
	w, e := acquire(h)
	if e != nil {
		return fail(err, e)
	}
	defer w.busy.Unlock()
	g, e := floats(grads, n)
	if e != nil {
		return fail(err, e)
	}
	ctx, cancel := deadline(timeoutMs)
	defer cancel()
	if _, e := w.Step(ctx, g); e != nil {
		return fail(err, e)
	}
	*step = C.int64_t(w.StepCount())
	return ok(err)
}

// fanin_step_many steps k workers at once, worker i with the n floats at grads[i], each in its own
// goroutine: several logical ranks of one process without a thread each on the caller's side. It
// fails with the first error in rank order, after every step has ended; *step is the step of the
// first worker.
//
//export fanin_step_many
func fanin_step_many(hs *C.uint64_t, grads **C.float, k C.int, n C.int64_t, timeoutMs C.int64_t, step *C.int64_t, err **C.char) C.int {
	if k <= 0 || hs == nil || grads == nil {
		return fail(err, fmt.Errorf("step_many: %d workers", int(k)))
	}
	hl, gl := unsafe.Slice(hs, int(k)), unsafe.Slice(grads, int(k))
	ws := make([]*worker, k)
	gs := make([][]float32, k)
	for i := range ws {
		var e error
		if ws[i], e = acquire(hl[i]); e != nil {
			return fail(err, e) // the workers acquired so far are released by their defers
		}
		defer ws[i].busy.Unlock()
		if gs[i], e = floats(gl[i], n); e != nil {
			return fail(err, e)
		}
	}
	ctx, cancel := deadline(timeoutMs)
	defer cancel()
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = w.Step(ctx, gs[i])
		}()
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return fail(err, e)
		}
	}
	*step = C.int64_t(ws[0].StepCount())
	return ok(err)
}

// fanin_version returns the library's version string (static; do not free).
//
//export fanin_version
func fanin_version() *C.char { return version }

var version = C.CString("fanin libfanin 1")

// gcPercent is the library's GOGC unless the environment sets one. Its gradient and parameter
// buffers belong to the caller, outside Go's heap, so the heap holds little but the step's
// messages in flight, and at Go's default of 100 the collector ran about 1.4 times a step (298
// collections in 210 steps of 4 ranks of a 1 MiB model, against 74 in a Go worker process whose
// heap holds its buffers): the step's p50 was 1.2x a Go worker's. At 400, 55-60 collections and
// the same p50 as the Go worker (docs/PYTHON.md, "Performance"). It costs a heap up to 5 times the
// messages in flight, small beside the model's buffers.
const gcPercent = 400

func init() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}
