// Package traceshape checks that a step's trace has the shape fanin promises (docs/TELEMETRY.md),
// whatever it was read from: the spans a test exported in memory, or Jaeger's query API.
package traceshape

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/fanin-ml/fanin/internal/telemetry"
)

// Span is a span as exported, reduced to what the shape needs. Ids are lower-case hex.
type Span struct {
	TraceID, SpanID, ParentID string // ParentID "" for a root
	Name                      string
	Service                   string
	Attrs                     map[string]string // values as text
	Links                     []string          // span ids this span links to
}

// Step is what the trace of one step must hold.
type Step struct {
	Job    string
	Step   int64
	Ranks  int
	Shards int
	// Function is the job's function, expected on every invocation.
	Function string
	// TraceID and RootID are the step's ids (telemetry.StepIDs), hex.
	TraceID, RootID string
}

// Check returns nil if spans (the whole trace) have the shape of one step, or an error that says
// what is missing or wrong:
//
//	fanin.step (rank 0, the step's root id)
//	└ fanin.worker.step × ranks
//	  └ fanin.worker.publish
//	    └ fanin.shard.invoke × shards, each the child of one rank's publish (links to the others)
//	      ├ fanin.shard.queue_wait, fanin.shard.gather, fanin.shard.function
//	      └ fanin.shard.publish
//	        └ fanin.worker.receive × ranks (or, for a missed push, a fanin.worker.fetch of the shard)
func Check(spans []Span, want Step) error {
	var errs []string
	fail := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	byID := map[string]Span{}
	byName := map[string][]Span{}
	for _, s := range spans {
		if s.TraceID != want.TraceID {
			fail("span %s %s is in trace %s, not the step's %s", s.Name, s.SpanID, s.TraceID, want.TraceID)
		}
		byID[s.SpanID] = s
		byName[s.Name] = append(byName[s.Name], s)
	}
	attr := func(s Span, key string) string { return s.Attrs[key] }
	needAttrs := func(s Span, kv map[string]string, keys ...string) {
		for _, k := range keys {
			if attr(s, k) == "" {
				fail("%s %s has no attribute %s", s.Name, s.SpanID, k)
			}
		}
		for k, v := range kv {
			if got := attr(s, k); got != v {
				fail("%s %s: attribute %s = %q, want %q", s.Name, s.SpanID, k, got, v)
			}
		}
	}
	parentName := func(s Span) string {
		if p, ok := byID[s.ParentID]; ok {
			return p.Name
		}
		return "(missing " + s.ParentID + ")"
	}
	stepStr := strconv.FormatInt(want.Step, 10)
	common := map[string]string{string(telemetry.AttrJob): want.Job, string(telemetry.AttrStep): stepStr}

	roots := byName[telemetry.SpanStep]
	if len(roots) != 1 {
		fail("%d %s spans, want 1 (rank 0's)", len(roots), telemetry.SpanStep)
	}
	for _, r := range roots {
		if r.SpanID != want.RootID || r.ParentID != "" {
			fail("%s is %s (parent %q), want the root with the step's id %s", r.Name, r.SpanID, r.ParentID, want.RootID)
		}
		needAttrs(r, common)
	}

	ranks := map[string]bool{}
	for _, s := range byName[telemetry.SpanWorkerStep] {
		if s.ParentID != want.RootID {
			fail("%s of rank %s has parent %s, want the step's root %s", s.Name, attr(s, string(telemetry.AttrRank)), s.ParentID, want.RootID)
		}
		needAttrs(s, common, string(telemetry.AttrRank))
		ranks[attr(s, string(telemetry.AttrRank))] = true
	}
	if len(ranks) != want.Ranks || len(byName[telemetry.SpanWorkerStep]) != want.Ranks {
		fail("%d %s spans of %d ranks, want one per rank (%d)", len(byName[telemetry.SpanWorkerStep]), telemetry.SpanWorkerStep, len(ranks), want.Ranks)
	}
	publishes := map[string]bool{}
	for _, s := range byName[telemetry.SpanWorkerPublish] {
		if parentName(s) != telemetry.SpanWorkerStep {
			fail("%s %s has parent %s, want a %s", s.Name, s.SpanID, parentName(s), telemetry.SpanWorkerStep)
		}
		needAttrs(s, common, string(telemetry.AttrRank), string(telemetry.AttrBytes))
		publishes[s.SpanID] = true
	}
	if len(publishes) != want.Ranks {
		fail("%d %s spans, want %d", len(publishes), telemetry.SpanWorkerPublish, want.Ranks)
	}

	shards := map[string]bool{}
	shardPublish := map[string]string{} // fanin.shard.publish span id -> shard
	for _, inv := range byName[telemetry.SpanInvoke] {
		if !publishes[inv.ParentID] {
			fail("%s of shard %s has parent %s, want a %s", inv.Name, attr(inv, string(telemetry.AttrShard)), parentName(inv), telemetry.SpanWorkerPublish)
		}
		needAttrs(inv, map[string]string{string(telemetry.AttrJob): want.Job, string(telemetry.AttrStep): stepStr,
			string(telemetry.AttrRanks): strconv.Itoa(want.Ranks), string(telemetry.AttrFunction): want.Function},
			string(telemetry.AttrShard), string(telemetry.AttrBytes), string(telemetry.AttrRuntime))
		shard := attr(inv, string(telemetry.AttrShard))
		shards[shard] = true
		if want.Ranks > 1 && len(inv.Links) == 0 {
			fail("%s of shard %s links to no other rank's publish", inv.Name, shard)
		}
		for _, l := range inv.Links {
			if !publishes[l] {
				fail("%s of shard %s links to %s, not a %s", inv.Name, shard, l, telemetry.SpanWorkerPublish)
			}
		}
		children := map[string]int{}
		for _, s := range spans {
			if s.ParentID == inv.SpanID {
				children[s.Name]++
				if s.Name == telemetry.SpanPublish {
					shardPublish[s.SpanID] = shard
				}
			}
		}
		for _, name := range []string{telemetry.SpanQueueWait, telemetry.SpanGather, telemetry.SpanFunction, telemetry.SpanPublish} {
			if children[name] != 1 {
				fail("%s of shard %s has %d %s children, want 1", inv.Name, shard, children[name], name)
			}
		}
	}
	if len(shards) != want.Shards || len(byName[telemetry.SpanInvoke]) != want.Shards {
		fail("%d %s spans of %d shards, want one per shard (%d)", len(byName[telemetry.SpanInvoke]), telemetry.SpanInvoke, len(shards), want.Shards)
	}

	got := map[string]bool{} // "rank/shard" that received the shard's parameters
	for _, s := range byName[telemetry.SpanWorkerReceive] {
		shard, ok := shardPublish[s.ParentID]
		if !ok {
			fail("%s %s has parent %s, want a %s", s.Name, s.SpanID, parentName(s), telemetry.SpanPublish)
			continue
		}
		needAttrs(s, map[string]string{string(telemetry.AttrShard): shard}, string(telemetry.AttrRank))
		got[attr(s, string(telemetry.AttrRank))+"/"+shard] = true
	}
	for _, s := range byName[telemetry.SpanWorkerFetch] { // a missed push, fetched from the stream
		if p, ok := byID[s.ParentID]; ok && p.Name == telemetry.SpanWorkerStep {
			got[attr(p, string(telemetry.AttrRank))+"/"+attr(s, string(telemetry.AttrShard))] = true
		}
	}
	var missing []string
	for r := range ranks {
		for sh := range shards {
			if !got[r+"/"+sh] {
				missing = append(missing, "rank "+r+" shard "+sh)
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		fail("no %s of: %s", telemetry.SpanWorkerReceive, strings.Join(missing, ", "))
	}
	if len(errs) > 0 {
		return fmt.Errorf("step %d of job %s: %d spans, not the shape of a step:\n  %s", want.Step, want.Job, len(spans), strings.Join(errs, "\n  "))
	}
	return nil
}

// Summary is one line per span name with its count, for logs.
func Summary(spans []Span) string {
	count := map[string]int{}
	for _, s := range spans {
		count[s.Service+" "+s.Name]++
	}
	keys := make([]string, 0, len(count))
	for k := range count {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s x%d\n", k, count[k])
	}
	return b.String()
}
