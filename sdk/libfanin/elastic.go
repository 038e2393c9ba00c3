package main

/*
#include <stdint.h>
*/
import "C"

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// Elastic workers (sdk.Client.Elastic) through the C ABI.
//
// The Go SDK's Elastic.Step calls a gradient function for every rank it holds, and again while it
// waits for ranks it gains then; from C that would be a callback from Go into the caller's
// language (into Python: taking the GIL on a thread of Go's). The ABI turns the calls around
// instead: the caller asks for the step's next event and answers it, and never receives a call.
//
//	fanin_elastic_next(h)        opens a step (Elastic.Step, run by the library) and waits for its
//	                             first event:
//	  FANIN_EVENT_GRADIENT       compute rank's gradient of step from the parameters now in the
//	                             worker's prev buffer, hand it over with fanin_elastic_grad, then
//	                             call fanin_elastic_next again;
//	  FANIN_EVENT_ASSIGNED       the worker's ranks changed (fanin_elastic_ranks reads them) and
//	                             no gradient is computed with them before the next call;
//	  FANIN_EVENT_DONE           the step is over: the parameters after it are in the worker's
//	                             params buffer, or the call failed with the step's error.
//	fanin_elastic_abort(h)       ends an open step with an error (the caller's own failed).
//
// A step that failed, or was aborted, may be run again: nothing is applied twice. The prev buffer
// is written only by fanin_elastic_next, before it reports a gradient; the params buffer is
// written whenever a step is open (parameters arrive while gradients are computed) and is the
// caller's once the step is done. driver.go holds the logic, without C types, to be tested in Go.

// elastic is an elastic handle's object: the SDK's elastic worker, writing the parameters after
// each step into the caller's params buffer and the parameters a gradient is computed from into
// the caller's prev buffer.
type elastic struct {
	*sdk.Elastic
	assign bool // the caller asked for FANIN_EVENT_ASSIGNED

	busy sync.Mutex // held by the call using the worker's step: a second one at once is refused
	d    driver     // its steps (driver.go)

	recordMu sync.Mutex // guards record, written by the step's publishes
	record   *os.File   // the record file (fanin_elastic's record), nil without one
}

// writeRecord appends r to the record file: one write, so a line is whole in the file (the
// kernel's) when it returns, whatever becomes of the process.
func (x *elastic) writeRecord(r sdk.GradRecord) {
	b, _ := json.Marshal(r)
	x.recordMu.Lock()
	defer x.recordMu.Unlock()
	if x.record != nil {
		_, _ = x.record.Write(append(b, '\n'))
	}
}

func (x *elastic) closeRecord() {
	x.recordMu.Lock()
	defer x.recordMu.Unlock()
	if x.record != nil {
		_ = x.record.Close()
		x.record = nil
	}
}

// fanin_elastic joins job id as an elastic worker (sdk.Client.Elastic) named worker_id (NULL or
// "": a random id). grad_dtype is NULL, "f32", "bf16" or "f16" (sdk.WithElasticGradDtype).
// params and prev are the caller's buffers of n floats each, every parameter of the job: params
// receives the parameters after each step (sdk.WithElasticParamsBuffer), prev the parameters
// each gradient is computed from; both must stay allocated until the worker is closed.
// on_assign non-zero makes fanin_elastic_next report FANIN_EVENT_ASSIGNED. record is NULL or a
// file to which the worker appends its record of every gradient message (sdk.WithRecord), one
// JSON object a line, each written before the call that made it returns (so it survives the
// process): what a replay of an ssp job needs (fanin_recorded_versions).
//
//export fanin_elastic
func fanin_elastic(h C.uint64_t, id, workerID, gradDtype *C.char, params, prev *C.float, n C.int64_t, onAssign C.int, record *C.char, timeoutMs C.int64_t, out *C.uint64_t, err **C.char) C.int {
	c, e := get[*sdk.Client](h)
	if e != nil {
		return fail(err, e)
	}
	p, e := floats(params, n)
	if e != nil {
		return fail(err, e)
	}
	q, e := floats(prev, n)
	if e != nil {
		return fail(err, e)
	}
	if len(p) > 0 && &p[0] == &q[0] {
		return fail(err, errors.New("elastic: params and prev must be two buffers"))
	}
	x := &elastic{assign: onAssign != 0, d: driver{prev: q}}
	opts := []sdk.ElasticOption{sdk.WithElasticParamsBuffer(p)}
	if workerID != nil && C.GoString(workerID) != "" {
		opts = append(opts, sdk.WithWorkerID(C.GoString(workerID)))
	}
	if x.assign {
		opts = append(opts, sdk.WithOnAssign(x.d.onAssign))
	}
	if gradDtype != nil {
		dt, ok := wire.ParseDtype(C.GoString(gradDtype))
		if !ok {
			return fail(err, wire.Rejectf(wire.ReasonBadDtype, "gradient dtype %q is not %s, %s or %s", C.GoString(gradDtype), wire.DtypeF32, wire.DtypeBF16, wire.DtypeF16))
		}
		opts = append(opts, sdk.WithElasticGradDtype(dt))
	}
	if record != nil && C.GoString(record) != "" {
		f, e := os.OpenFile(C.GoString(record), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if e != nil {
			return fail(err, fmt.Errorf("elastic: the record: %w", e))
		}
		x.record = f
		opts = append(opts, sdk.WithRecord(x.writeRecord))
	}
	ctx, cancel := deadline(timeoutMs)
	defer cancel()
	el, e := c.Elastic(ctx, C.GoString(id), opts...)
	if e != nil {
		x.closeRecord()
		return fail(err, e)
	}
	x.Elastic, x.d.w = el, el
	*out = put(x)
	return ok(err)
}

// acquireElastic takes the elastic worker of handle h for one call; the caller releases it with
// x.busy.Unlock.
func acquireElastic(h C.uint64_t) (*elastic, error) {
	x, err := get[*elastic](h)
	if err != nil {
		return nil, err
	}
	if !x.busy.TryLock() {
		return nil, fmt.Errorf("elastic worker %s is in use by another call", x.ID())
	}
	return x, nil
}

// fanin_elastic_next opens a step if none is open (timeout_ms bounds the whole step), answers the
// pending FANIN_EVENT_ASSIGNED if there is one, and waits for the step's next event: it sets
// *event, and for FANIN_EVENT_GRADIENT *rank and *step (the parameters are in prev), for
// FANIN_EVENT_DONE *step (of the parameters now in params) and *own (the worker's own step:
// ahead of *step in an ssp job). A step that failed returns its error, and is over.
//
//export fanin_elastic_next
func fanin_elastic_next(h C.uint64_t, timeoutMs C.int64_t, ev *C.int, rank *C.int, step, own *C.int64_t, err **C.char) C.int {
	x, e := acquireElastic(h)
	if e != nil {
		return fail(err, e)
	}
	defer x.busy.Unlock()
	v, e := x.d.next(time.Duration(max(timeoutMs, 0)) * time.Millisecond)
	if e != nil {
		return fail(err, fmt.Errorf("elastic worker %s: %w", x.ID(), e))
	}
	switch v.kind {
	case eventDone:
		*step, *own = C.int64_t(v.step), C.int64_t(v.own)
	case eventGradient:
		*rank, *step = C.int(v.rank), C.int64_t(v.step)
	}
	*ev = C.int(v.kind)
	return ok(err)
}

// fanin_elastic_grad answers the pending FANIN_EVENT_GRADIENT with its gradient (n floats,
// copied).
//
//export fanin_elastic_grad
func fanin_elastic_grad(h C.uint64_t, grad *C.float, n C.int64_t, err **C.char) C.int {
	x, e := acquireElastic(h)
	if e != nil {
		return fail(err, e)
	}
	defer x.busy.Unlock()
	g, e := floats(grad, n)
	if e != nil {
		return fail(err, e)
	}
	if e := x.d.grad(g); e != nil {
		return fail(err, fmt.Errorf("elastic worker %s: %w", x.ID(), e))
	}
	return ok(err)
}

// fanin_elastic_abort ends the open step, if any, with an error, and returns once it is over.
//
//export fanin_elastic_abort
func fanin_elastic_abort(h C.uint64_t) {
	x, e := get[*elastic](h)
	if e != nil {
		return
	}
	x.busy.Lock()
	defer x.busy.Unlock()
	x.d.abort()
}

// fanin_elastic_ranks copies the ranks the worker holds now into ranks (room for cap of them;
// the job's rank count is enough), sets *n to their count and *epoch to the assignment's epoch.
//
//export fanin_elastic_ranks
func fanin_elastic_ranks(h C.uint64_t, ranks *C.int, capacity C.int, n *C.int, epoch *C.uint64_t, err **C.char) C.int {
	x, e := get[*elastic](h)
	if e != nil {
		return fail(err, e)
	}
	held := x.Ranks()
	if len(held) > int(capacity) || (ranks == nil && len(held) > 0) {
		return fail(err, fmt.Errorf("elastic worker %s holds %d ranks, room for %d", x.ID(), len(held), int(capacity)))
	}
	if len(held) > 0 {
		out := unsafe.Slice(ranks, len(held))
		for i, r := range held {
			out[i] = C.int(r)
		}
	}
	*n, *epoch = C.int(len(held)), C.uint64_t(x.Epoch())
	return ok(err)
}

// fanin_elastic_versions copies the versions of the parameters in params, per shard, into
// versions (n of them: the job's shard count; sdk.Elastic.Versions).
//
//export fanin_elastic_versions
func fanin_elastic_versions(h C.uint64_t, versions *C.int64_t, n C.int, err **C.char) C.int {
	x, e := get[*elastic](h)
	if e != nil {
		return fail(err, e)
	}
	return copyVersions(x.Versions(), versions, n, err)
}

func copyVersions(vs []int64, out *C.int64_t, n C.int, err **C.char) C.int {
	if int(n) != len(vs) || (out == nil && n > 0) {
		return fail(err, fmt.Errorf("versions: room for %d, the job has %d shards", int(n), len(vs)))
	}
	if n > 0 {
		o := unsafe.Slice(out, int(n))
		for i, v := range vs {
			o[i] = C.int64_t(v)
		}
	}
	return ok(err)
}

// fanin_elastic_leave leaves the job gracefully (sdk.Elastic.Leave), ending an open step first,
// and closes the worker: its ranks move to the others at once. The handle is released even when
// it fails.
//
//export fanin_elastic_leave
func fanin_elastic_leave(h C.uint64_t, timeoutMs C.int64_t, err **C.char) C.int {
	x, isElastic := drop(h).(*elastic)
	if !isElastic {
		return fail(err, fmt.Errorf("handle %d is not an open elastic worker (closed already?)", uint64(h)))
	}
	x.busy.Lock()
	defer x.busy.Unlock()
	x.d.abort()
	ctx, cancel := deadline(timeoutMs)
	defer cancel()
	e := x.Leave(ctx)
	x.closeRecord()
	if e != nil {
		return fail(err, e)
	}
	return ok(err)
}

// fanin_elastic_close is fanin_elastic_leave with a timeout of 2 s and no error.
//
//export fanin_elastic_close
func fanin_elastic_close(h C.uint64_t) {
	if x, isElastic := drop(h).(*elastic); isElastic {
		x.busy.Lock()
		x.d.abort()
		_ = x.Close()
		x.closeRecord()
		x.busy.Unlock()
	}
}

// fanin_worker_versions copies the versions of the parameters the worker holds, per shard, into
// versions (n of them: the job's shard count; sdk.Worker.Versions), and sets *own to the last step
// it published (sdk.Worker.OwnStep: in an ssp or asp job its own step, which the parameters may
// lag).
//
//export fanin_worker_versions
func fanin_worker_versions(h C.uint64_t, versions *C.int64_t, n C.int, own *C.int64_t, err **C.char) C.int {
	w, e := acquire(h)
	if e != nil {
		return fail(err, e)
	}
	defer w.busy.Unlock()
	*own = C.int64_t(w.OwnStep())
	return copyVersions(w.Versions(), versions, n, err)
}

// fanin_recorded_versions reads the records of every elastic worker of a job (the files of
// fanin_elastic's record, concatenated: JSON lines, each worker's in the order it wrote them) and
// sets *versions to JSON, to free with fanin_free: [[rank, step, shard, version], ...], the version
// of the parameters each stored gradient was computed from (sdk.RecordedVersions: an intent no
// later record resolved counts, a duplicate does not). A line cut short (a worker killed while it
// wrote it) ends that worker's record: it is skipped.
//
//export fanin_recorded_versions
func fanin_recorded_versions(records *C.char, n C.int64_t, versions **C.char, err **C.char) C.int {
	if n < 0 || (records == nil && n > 0) {
		return fail(err, fmt.Errorf("recorded versions: %d bytes at %p", int64(n), records))
	}
	var data []byte
	if n > 0 {
		data = C.GoBytes(unsafe.Pointer(records), C.int(n))
	}
	var all []sdk.GradRecord
	type key struct {
		rank  int
		step  int64
		shard int
	}
	keys := map[key]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var r sdk.GradRecord
		if e := json.Unmarshal(sc.Bytes(), &r); e != nil {
			continue // cut short by the death of its worker
		}
		all = append(all, r)
		keys[key{r.Rank, r.Step, r.Shard}] = true
	}
	if e := sc.Err(); e != nil {
		return fail(err, fmt.Errorf("recorded versions: %w", e))
	}
	version := sdk.RecordedVersions(all)
	out := [][4]int64{}
	for k := range keys {
		if v, ok := version(k.rank, k.step, k.shard); ok {
			out = append(out, [4]int64{int64(k.rank), k.step, int64(k.shard), v})
		}
	}
	b, e := json.Marshal(out)
	if e != nil {
		return fail(err, e)
	}
	*versions = C.CString(string(b))
	return ok(err)
}
