package main

/*
#include <stdint.h>
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// applied is an applied-order handle's object: a record of which gradient made each version of
// each shard of an asp job, from its parameters' pushes (docs/PROTOCOL.md, "asp": the order can be
// recorded only from the pushes). With the versions each gradient was computed from, it is all
// that fanin's reference needs to replay an asp run.
type applied struct {
	sub *nats.Subscription

	mu        sync.Mutex               // guards the fields below, written by the subscription
	order     map[int]map[int64]string // shard -> version -> "<rank>.<step>"
	conflicts []string                 // a version pushed again naming another gradient
}

// fanin_applied_watch starts recording the applied order of job id's parameters (an asp job:
// Fanin-Applied), on the client's connection with the job's credentials. Start it before the
// job's first gradient: versions pushed before are not recorded. Release it with
// fanin_applied_close.
//
//export fanin_applied_watch
func fanin_applied_watch(h C.uint64_t, id *C.char, out *C.uint64_t, err **C.char) C.int {
	c, e := get[*sdk.Client](h)
	if e != nil {
		return fail(err, e)
	}
	a := &applied{order: map[int]map[int64]string{}}
	job := C.GoString(id)
	sub, e := c.Conn().Subscribe(wire.ParamsWildcard(job), a.note)
	if e != nil {
		return fail(err, fmt.Errorf("watch the parameters of job %q: %w", job, e))
	}
	_ = sub.SetPendingLimits(-1, -1) // a slow consumer would lose versions
	if e := c.Conn().Flush(); e != nil {
		_ = sub.Unsubscribe()
		return fail(err, fmt.Errorf("watch the parameters of job %q: %w", job, e))
	}
	a.sub = sub
	*out = put(a)
	return ok(err)
}

func (a *applied) note(m *nats.Msg) {
	shard, ok := wire.ShardFromSubject(m.Subject)
	v, err := wire.ParseStep(m.Header)
	g := m.Header.Get(wire.HdrApplied)
	if !ok || err != nil || g == "" {
		return // not an asp update (the initial parameters, or a bsp or ssp job)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.order[shard] == nil {
		a.order[shard] = map[int64]string{}
	}
	if old, seen := a.order[shard][v]; seen && old != g {
		a.conflicts = append(a.conflicts, fmt.Sprintf("shard %d version %d was made by %s and, pushed again, by %s", shard, v, old, g))
	}
	a.order[shard][v] = g
}

// fanin_applied_read sets *doc to the record so far as JSON, to free with fanin_free:
// {"shards": {"<shard>": {"<version>": "<rank>.<step>", ...}, ...}, "conflicts": [...]}; a
// conflict is a version pushed twice naming two gradients, which fanin never does.
//
//export fanin_applied_read
func fanin_applied_read(h C.uint64_t, doc **C.char, err **C.char) C.int {
	a, e := get[*applied](h)
	if e != nil {
		return fail(err, e)
	}
	a.mu.Lock()
	d := struct {
		Shards    map[string]map[string]string `json:"shards"`
		Conflicts []string                     `json:"conflicts"`
	}{Shards: map[string]map[string]string{}, Conflicts: append([]string{}, a.conflicts...)}
	for s, vs := range a.order {
		m := map[string]string{}
		for v, g := range vs {
			m[strconv.FormatInt(v, 10)] = g
		}
		d.Shards[strconv.Itoa(s)] = m
	}
	a.mu.Unlock()
	b, e := json.Marshal(d)
	if e != nil {
		return fail(err, e)
	}
	*doc = C.CString(string(b))
	return ok(err)
}

// fanin_applied_close stops recording and releases the handle.
//
//export fanin_applied_close
func fanin_applied_close(h C.uint64_t) {
	if a, isApplied := drop(h).(*applied); isApplied {
		_ = a.sub.Unsubscribe()
	}
}
