package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/functions/wasmfn"
	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/lab/wasmbuild"
	"github.com/fanin-ml/fanin/sdk"
)

// uploadFunction posts a module to the gateway as the admin and returns the name a job spec
// gives it (owner/name@1).
func uploadFunction(t *testing.T, api, name string, code []byte) string {
	t.Helper()
	resp, err := http.Post(api+"/v1/functions?name="+name+"&version=1", "application/wasm", strings.NewReader(string(code)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("upload %s: %s: %s", name, resp.Status, body)
	}
	var up gateway.FunctionUpload
	if err := json.Unmarshal(body, &up); err != nil {
		t.Fatalf("upload %s: %v: %s", name, err, body)
	}
	return up.Function
}

// shardRuntimes maps each shard of the job to the runtime that serves it.
func shardRuntimes(t *testing.T, api, id string) map[int]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ss, err := sdk.NewAdmin(api).Shards(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, s := range ss {
		out[s.ID] = s.Runtime
	}
	return out
}

// A job whose function is a user module (the Lion example, with a state vector) trains while the
// runtime serving most of its shards is SIGKILLed: its shards move to other runtimes (new
// instances of the module, state restored from checkpoints and the stream), and every step stays
// bit-identical to the reference running the same module in this process.
func TestFaultsUserFunctionRuntimeKill(t *testing.T) {
	skipShort(t)
	lion := wasmbuild.ForTest(t, "../examples/functions/lion")
	nn := startNATS(t, 1)
	f := startFanin(t, nn, 1)
	name := uploadFunction(t, f.api, "lion", lion)
	spec := clusterSpec("uf-kill", name)
	spec.Function.Hyper = map[string]float64{"lr": 0.001, "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.01}
	var rec *job.Record
	testutil.CheckFor(t, 60*time.Second, 250*time.Millisecond, func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rec, err = sdk.NewAdmin(f.api).CreateJob(ctx, spec)
		return err
	})
	e, err := wasmfn.NewEngine(context.Background(), wasmfn.Limits{CallTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	m, err := e.Load(context.Background(), lion)
	if err != nil {
		t.Fatal(err)
	}
	fn, err := m.New(rec.Spec.Function.Name, rec.Spec.Function.Hyper, rec.Spec.AllowNonFinite)
	if err != nil {
		t.Fatal(err)
	}
	// newTrainer makes its reference from the spec's function, which for a user function needs
	// the module: it gets a copy of the record naming a built-in, and its reference is then
	// replaced by the module's, from the parameters of step 0 that the trainer holds.
	shadow := *rec
	shadow.Spec.Function = job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.01}}
	tt := &timedTrainer{trainer: newTrainer(t, nn.url(), &shadow), rec: rec}
	tt.onStall = func() { nn.dumpJob(rec) }
	tt.ref = functions.NewReference(fn, rec.Spec.Ranks, rec.Layout.Ranges(), slices.Clone(tt.params))

	tt.run(5)
	before := shardRuntimes(t, f.api, spec.ID)
	count := map[string]int{}
	for _, rt := range before {
		count[rt]++
	}
	victim := ""
	for _, rt := range slices.Sorted(maps.Keys(count)) {
		if rt != "" && count[rt] > count[victim] {
			victim = rt
		}
	}
	pids := runtimePids()[victim]
	if victim == "" || len(pids) == 0 {
		t.Fatalf("no runtime process to kill: shards on %v, processes %v", before, runtimePids())
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	t.Logf("SIGKILL of runtime %s (%d of %d shards) at step %d", victim, count[victim], len(before), tt.step)
	killed := time.Now()
	tt.run(tt.step + 10)

	var moved []string
	testutil.CheckFor(t, 30*time.Second, 200*time.Millisecond, func() error {
		after := shardRuntimes(t, f.api, spec.ID)
		moved = moved[:0]
		for id, rt := range before {
			if rt != victim {
				continue
			}
			if after[id] == victim || after[id] == "" {
				return fmt.Errorf("shard %d is still placed on %q", id, after[id])
			}
			moved = append(moved, fmt.Sprintf("%d: %s -> %s", id, victim, after[id]))
		}
		return nil
	})
	tt.checkUpdates(nn.url())
	checkOneProcessPerID(t)
	t.Logf("%d steps of %s bit-exact; shards moved %v; longest gap after the kill %v", tt.step, name,
		moved, tt.longestGapSince(killed).Round(time.Millisecond))
}
