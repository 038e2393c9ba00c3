package members

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func member(id string, joined int) Member {
	return Member{Beat: wire.WorkerBeat{ID: id}, Joined: t0.Add(time.Duration(joined) * time.Second), Last: t0}
}

func owners(a *wire.Assignment) map[string][]int {
	m := map[string][]int{}
	for _, w := range a.Workers {
		m[w.ID] = w.Ranks
	}
	return m
}

func TestAssignSpreadsEvenlyAndSticks(t *testing.T) {
	t.Parallel()
	a := Assign("j", 4, 0, []Member{member("x", 1), member("y", 2), member("z", 3)}, nil, t0)
	if got := fmt.Sprint(owners(a)); got != "map[x:[0 1] y:[2] z:[3]]" {
		t.Fatalf("first assignment %s", got)
	}
	if a.Epoch != 1 {
		t.Fatalf("epoch %d, want 1", a.Epoch)
	}
	// y leaves: its rank goes to the worker below its share; x and z keep theirs.
	b := Assign("j", 4, 0, []Member{member("x", 1), member("z", 3)}, a, t0)
	if got := fmt.Sprint(owners(b)); got != "map[x:[0 1] z:[2 3]]" {
		t.Fatalf("after y left %s", got)
	}
	if b.Epoch != 2 {
		t.Fatalf("epoch %d, want 2", b.Epoch)
	}
	// Nothing changes: same epoch.
	if c := Assign("j", 4, 0, []Member{member("z", 3), member("x", 1)}, b, t0); c.Epoch != 2 || fmt.Sprint(owners(c)) != fmt.Sprint(owners(b)) {
		t.Fatalf("an unchanged membership changed the assignment: %v epoch %d", owners(c), c.Epoch)
	}
	// w joins: the shares are x (first) 2, z 1, w 1; z keeps its lowest rank, 3 goes to w.
	d := Assign("j", 4, 0, []Member{member("x", 1), member("z", 3), member("w", 4)}, b, t0)
	if got := fmt.Sprint(owners(d)); got != "map[w:[3] x:[0 1] z:[2]]" {
		t.Fatalf("after w joined %s", got)
	}
	// Every rank has exactly one owner, always.
	for _, as := range []*wire.Assignment{a, b, d} {
		var all []int
		for _, rs := range owners(as) {
			all = append(all, rs...)
		}
		slices.Sort(all)
		if !slices.Equal(all, []int{0, 1, 2, 3}) {
			t.Fatalf("ranks %v", all)
		}
	}
}

func TestAssignTargetAndStandby(t *testing.T) {
	t.Parallel()
	live := []Member{member("x", 1), member("y", 2), member("z", 3)}
	a := Assign("j", 4, 2, live, nil, t0)
	if got := fmt.Sprint(owners(a)); got != "map[x:[0 1] y:[2 3] z:[]]" {
		t.Fatalf("target 2: %s", got)
	}
	if !a.Workers[2].Standby || a.Workers[0].Standby {
		t.Fatalf("standby flags %+v", a.Workers)
	}
	// More workers than ranks: the extra ones stand by.
	b := Assign("j", 2, 0, live, nil, t0)
	if got := fmt.Sprint(owners(b)); got != "map[x:[0] y:[1] z:[]]" {
		t.Fatalf("3 workers, 2 ranks: %s", got)
	}
	// No worker: every rank unassigned.
	c := Assign("j", 3, 0, nil, b, t0)
	if !slices.Equal(c.Unassigned, []int{0, 1, 2}) || c.Epoch != b.Epoch+1 {
		t.Fatalf("no workers: unassigned %v epoch %d", c.Unassigned, c.Epoch)
	}
	// A stored assignment with ranks out of range (the job was re-created smaller) is repaired.
	bad := &wire.Assignment{Epoch: 7, Workers: []wire.AssignedWorker{{ID: "x", Ranks: []int{5, 0, -1}}}}
	d := Assign("j", 2, 0, []Member{member("x", 1)}, bad, t0)
	if got := fmt.Sprint(owners(d)); got != "map[x:[0 1]]" || d.Epoch != 8 {
		t.Fatalf("repaired %s epoch %d", got, d.Epoch)
	}
}

func TestObserveRefusesBadBeats(t *testing.T) {
	t.Parallel()
	now := t0
	jobs := func() map[string]job.Record {
		return map[string]job.Record{"j": {Spec: job.Spec{ID: "j", Ranks: 2}}, "flood": {Spec: job.Spec{ID: "flood", Ranks: job.MaxRanks}}}
	}
	a := New(nil, nil, jobs, nil, nil).WithClock(func() time.Time { return now })
	beat := func(subject string, b any) {
		data, _ := json.Marshal(b)
		a.Observe(subject, data)
	}
	beat(wire.WorkersSubject("j"), wire.WorkerBeat{ID: "ok"})
	beat(wire.WorkersSubject("j"), wire.WorkerBeat{ID: "bad id"})
	beat(wire.WorkersSubject("j"), wire.WorkerBeat{ID: ""})
	beat("fanin.v1.j.x.workers", wire.WorkerBeat{ID: "sub"})
	beat(wire.WorkersSubject("j"), map[string]any{"id": "big", "host": string(make([]byte, wire.MaxBeatBytes))})
	a.Observe(wire.WorkersSubject("j"), []byte("{not json"))
	live := a.Live("j")
	if len(live) != 1 || live[0].Beat.ID != "ok" {
		t.Fatalf("live %+v, want only ok", live)
	}
	// Leaving removes at once; silence removes after the lapse.
	beat(wire.WorkersSubject("j"), wire.WorkerBeat{ID: "other"})
	beat(wire.WorkersSubject("j"), wire.WorkerBeat{ID: "ok", Leaving: true})
	if live := a.Live("j"); len(live) != 1 || live[0].Beat.ID != "other" {
		t.Fatalf("after leaving: %+v", live)
	}
	now = now.Add(wire.WorkerLapse)
	if live := a.Live("j"); len(live) != 0 {
		t.Fatalf("after the lapse: %+v", live)
	}
	// One job cannot grow the table without bound.
	for i := range MaxWorkersPerJob + 10 {
		beat(wire.WorkersSubject("flood"), wire.WorkerBeat{ID: fmt.Sprint("w", i)})
	}
	if n := len(a.Live("flood")); n != MaxWorkersPerJob {
		t.Fatalf("%d workers kept, want %d", n, MaxWorkersPerJob)
	}
}
