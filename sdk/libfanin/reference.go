package main

/*
#include <stdint.h>
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"unsafe"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/job"
)

// reference is a reference handle's object: fanin's single-process reference of a job, what every
// deployment must reproduce bit for bit (functions.Reference), for checking a run from its logged
// gradients.
type reference struct {
	*functions.Reference
	ranks, elements, shards int
}

// fanin_reference makes the reference of a job from its record (the JSON of fanin_job) and its
// initial parameters (n floats, copied).
//
//export fanin_reference
func fanin_reference(record *C.char, init *C.float, n C.int64_t, out *C.uint64_t, err **C.char) C.int {
	var rec job.Record
	if e := json.Unmarshal([]byte(C.GoString(record)), &rec); e != nil {
		return fail(err, fmt.Errorf("record: %w", e))
	}
	if int(n) != rec.Layout.Elements {
		return fail(err, fmt.Errorf("%d initial parameters, job %q has %d", int64(n), rec.Spec.ID, rec.Layout.Elements))
	}
	fn, e := rec.Spec.NewFunc()
	if e != nil {
		return fail(err, e)
	}
	p, e := floats(init, n)
	if e != nil {
		return fail(err, e)
	}
	ref := functions.NewReference(fn, rec.Spec.Ranks, rec.Layout.Ranges(), p) // copies p
	*out = put(&reference{Reference: ref, ranks: rec.Spec.Ranks, elements: rec.Layout.Elements, shards: rec.Layout.NumShards()})
	return ok(err)
}

// fanin_reference_step applies one step: grads[r] is rank r's gradient (n floats each, one per
// rank); weights is NULL or one per rank (fedavg). params (n floats) receives the parameters after
// it.
//
//export fanin_reference_step
func fanin_reference_step(h C.uint64_t, grads **C.float, k C.int, n C.int64_t, weights *C.double, params *C.float, err **C.char) C.int {
	r, e := get[*reference](h)
	if e != nil {
		return fail(err, e)
	}
	if int(k) != r.ranks || int(n) != r.elements || grads == nil {
		return fail(err, fmt.Errorf("reference step: %d gradients of %d floats, the job has %d ranks and %d parameters", int(k), int64(n), r.ranks, r.elements))
	}
	gs := make([][]float32, k)
	for i, g := range unsafe.Slice(grads, int(k)) {
		if gs[i], e = floats(g, n); e != nil {
			return fail(err, e)
		}
	}
	var ws []float64
	if weights != nil {
		ws = unsafe.Slice((*float64)(unsafe.Pointer(weights)), int(k))
	}
	out, e := floats(params, n)
	if e != nil {
		return fail(err, e)
	}
	r.Step(gs, ws)
	copy(out, r.Params())
	return ok(err)
}

// fanin_reference_apply applies one rank's gradient (n floats, the whole model) to one shard on its
// own, as an asp job's runtime does (functions.Reference.ApplyRank): shard is the shard's index in
// the layout, weight the rank's weight (weighted functions only). params (n floats) receives the
// parameters after it.
//
//export fanin_reference_apply
func fanin_reference_apply(h C.uint64_t, shard C.int, grad *C.float, n C.int64_t, weight C.double, params *C.float, err **C.char) C.int {
	r, e := get[*reference](h)
	if e != nil {
		return fail(err, e)
	}
	if int(n) != r.elements || grad == nil {
		return fail(err, fmt.Errorf("reference apply: a gradient of %d floats, the job has %d parameters", int64(n), r.elements))
	}
	if int(shard) < 0 || int(shard) >= r.shards {
		return fail(err, fmt.Errorf("reference apply: no shard %d, the job has %d", int(shard), r.shards))
	}
	g, e := floats(grad, n)
	if e != nil {
		return fail(err, e)
	}
	out, e := floats(params, n)
	if e != nil {
		return fail(err, e)
	}
	r.ApplyRank(int(shard), g, float64(weight))
	copy(out, r.Params())
	return ok(err)
}

//export fanin_reference_close
func fanin_reference_close(h C.uint64_t) { drop(h) }
