package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// cli runs one client command against the stack and returns its output.
func cli(t *testing.T, st *devstack.Stack, mk func() *cobra.Command, args ...string) (string, error) {
	t.Helper()
	cmd := mk()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append(args, "--api", st.HTTPURL, "--token", st.AdminToken))
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func mustCLI(t *testing.T, st *devstack.Stack, mk func() *cobra.Command, args ...string) string {
	t.Helper()
	out, err := cli(t, st, mk, args...)
	if err != nil {
		t.Fatalf("fanin %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// The CLI drives fanin through the API: jobs, pool, policy, tokens, and top, as tables and JSON.
func TestCLI(t *testing.T) {
	t.Parallel()
	st, err := devstack.Start(context.Background(), devstack.Config{
		DataDir: t.TempDir(), NATSPort: -1, HTTPAddr: "127.0.0.1:0", Runtimes: 2, Logger: testutil.Logger(), Auth: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dir := t.TempDir()
	spec := filepath.Join(dir, "tiny.yaml")
	if err := os.WriteFile(spec, []byte("id: tiny\ntensors: [{name: w, shape: [4]}]\nranks: 1\nfunction: {name: sgd, hyper: {lr: 0.5}}\nshard_size: 4KiB\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	out := mustCLI(t, st, jobsCmd, "create", "-f", spec, "--creds-dir", filepath.Join(dir, "creds"))
	if !strings.Contains(out, "tiny") || !strings.Contains(out, "--inbox-prefix fanin.v1.tiny.inbox") || strings.Contains(out, "SEED") {
		t.Fatalf("jobs create:\n%s", out)
	}
	creds, err := os.ReadFile(filepath.Join(dir, "creds", "tiny.creds"))
	if err != nil || !strings.Contains(string(creds), "USER NKEY SEED") {
		t.Fatalf("the .creds file: %v", err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "creds", "tiny.creds")); fi.Mode().Perm() != 0o600 {
		t.Fatalf(".creds mode %v", fi.Mode())
	}
	if _, err := cli(t, st, jobsCmd, "create", "-f", spec); err == nil || !strings.Contains(err.Error(), "job_exists") {
		t.Fatalf("creating twice: %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	_ = os.WriteFile(bad, []byte("id: bad\ntensors: [{name: w, shape: [4]}]\nranks: 1\nfunction: {name: lbfgs}\n"), 0o600)
	if _, err := cli(t, st, jobsCmd, "create", "-f", bad); err == nil || !strings.Contains(err.Error(), "unknown_function") {
		t.Fatalf("unknown function: %v", err)
	}

	out = mustCLI(t, st, jobsCmd, "ls")
	if !regexp.MustCompile(`(?m)^tiny\s+running\s+0\s`).MatchString(out) {
		t.Fatalf("jobs ls:\n%s", out)
	}
	var sts []api.JobStatus
	if err := json.Unmarshal([]byte(mustCLI(t, st, jobsCmd, "ls", "-o", "json")), &sts); err != nil || len(sts) != 1 || sts[0].Spec.ID != "tiny" {
		t.Fatalf("jobs ls -o json: %v %+v", err, sts)
	}
	if _, err := cli(t, st, jobsCmd, "ls", "-o", "xml"); err == nil {
		t.Fatal("-o xml accepted")
	}
	out = mustCLI(t, st, jobsCmd, "get", "tiny")
	if !strings.Contains(out, "job tiny: running") || !strings.Contains(out, "SHARD") {
		t.Fatalf("jobs get:\n%s", out)
	}
	out = mustCLI(t, st, jobsCmd, "rejects", "tiny")
	if !strings.Contains(out, "job tiny: 0 rejected inputs") {
		t.Fatalf("jobs rejects:\n%s", out)
	}
	out = mustCLI(t, st, jobsCmd, "pause", "tiny")
	if !strings.Contains(out, "tiny paused at step 0") {
		t.Fatalf("jobs pause:\n%s", out)
	}
	out = mustCLI(t, st, jobsCmd, "resume", "tiny")
	if !strings.Contains(out, "tiny running") {
		t.Fatalf("jobs resume:\n%s", out)
	}
	out = mustCLI(t, st, jobsCmd, "creds", "tiny", "--out", filepath.Join(dir, "more.creds"))
	if !strings.Contains(out, "inbox prefix fanin.v1.tiny.inbox") {
		t.Fatalf("jobs creds:\n%s", out)
	}

	// Elastic workers: none yet; the target is validated and set; an assignment is shown.
	out = mustCLI(t, st, jobsCmd, "workers", "tiny")
	if !strings.Contains(out, "job tiny: 1 ranks, target all; 0 live workers") || !strings.Contains(out, "no elastic worker") {
		t.Fatalf("jobs workers:\n%s", out)
	}
	if _, err := cli(t, st, jobsCmd, "scale", "tiny", "--workers", "2"); err == nil || !strings.Contains(err.Error(), "bad_parameter") {
		t.Fatalf("jobs scale beyond the ranks: %v", err)
	}
	if _, err := cli(t, st, jobsCmd, "scale", "tiny"); err == nil || !strings.Contains(err.Error(), "workers") {
		t.Fatalf("jobs scale without --workers: %v", err)
	}
	if out = mustCLI(t, st, jobsCmd, "scale", "tiny", "--workers", "1"); !strings.Contains(out, "tiny: target 1;") {
		t.Fatalf("jobs scale:\n%s", out)
	}
	putAssignment(t, st, wire.Assignment{Job: "tiny", Epoch: 2, Target: 1, Updated: time.Now(), Workers: []wire.AssignedWorker{
		{ID: "w1", Host: "gpu-1", PID: 42, Ranks: []int{0}, Step: 7, LastBeat: time.Now().Add(-time.Second)},
		{ID: "w2", Host: "gpu-2", Ranks: []int{}, Step: 7, LastBeat: time.Now(), Standby: true},
	}})
	admin := sdk.NewAdmin(st.HTTPURL, sdk.WithToken(st.AdminToken))
	testutil.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if ws, err := admin.Workers(context.Background(), "tiny"); err != nil || ws.Epoch != 2 {
			return fmt.Errorf("assignment not seen yet: %+v %v", ws, err)
		}
		return nil
	})
	out = mustCLI(t, st, jobsCmd, "workers", "tiny")
	for _, re := range []string{`target 1; 2 live workers, 1 standing by; assignment epoch 2`,
		`(?m)^w1\s+gpu-1\s+42\s+0\s+7\s+1(\.\d)?s ago\s+-$`, `(?m)^w2\s+gpu-2\s+-\s+-\s+7\s+\S+ ago\s+yes$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Fatalf("jobs workers lacks %s:\n%s", re, out)
		}
	}
	var ws api.JobWorkers
	if err := json.Unmarshal([]byte(mustCLI(t, st, jobsCmd, "workers", "tiny", "-o", "json")), &ws); err != nil || len(ws.Workers) != 2 || ws.Target != 1 {
		t.Fatalf("jobs workers -o json: %v %+v", err, ws)
	}
	if out = mustCLI(t, st, jobsCmd, "ls"); !regexp.MustCompile(`(?m)^tiny\s+running\s+\S+\s+\S+\s+1\s+2/1\s`).MatchString(out) {
		t.Fatalf("jobs ls lacks the workers 2/1:\n%s", out)
	}
	if out = mustCLI(t, st, jobsCmd, "get", "tiny"); !strings.Contains(out, "elastic workers: 2 live, target 1") {
		t.Fatalf("jobs get lacks the workers:\n%s", out)
	}

	out = mustCLI(t, st, poolCmd)
	if !strings.Contains(out, "2 runtimes") || !strings.Contains(out, "rt-0") {
		t.Fatalf("pool:\n%s", out)
	}

	out = mustCLI(t, st, policyCmd, "get")
	if !strings.Contains(out, "# default policy") || !strings.Contains(out, "min_runtimes: 2") {
		t.Fatalf("policy get:\n%s", out)
	}
	pol := filepath.Join(dir, "policy.yaml")
	_ = os.WriteFile(pol, []byte("min_runtimes: 2\nmax_runtimes: 5\n"), 0o600)
	if out = mustCLI(t, st, policyCmd, "set", "-f", pol); !strings.Contains(out, "revision") {
		t.Fatalf("policy set:\n%s", out)
	}
	_ = os.WriteFile(pol, []byte("max_runtimes: -5\n"), 0o600)
	if _, err := cli(t, st, policyCmd, "set", "-f", pol); err == nil || !strings.Contains(err.Error(), "invalid_policy") {
		t.Fatalf("invalid policy: %v", err)
	}
	if out = mustCLI(t, st, policyCmd, "history"); !regexp.MustCompile(`(?m)^\d+\s+\S+ \S+\s+2\s+5\s`).MatchString(out) {
		t.Fatalf("policy history:\n%s", out)
	}
	mustCLI(t, st, policyCmd, "decisions", "--limit", "3")

	out = mustCLI(t, st, tokensCmd, "create", "vision", "--jobs", "2", "--bytes-per-second", "10MiB")
	tok := regexp.MustCompile(`fanin_team_\S+`).FindString(out)
	if tok == "" {
		t.Fatalf("tokens create:\n%s", out)
	}
	if out = mustCLI(t, st, tokensCmd, "ls"); !strings.Contains(out, "vision") || strings.Contains(out, tok) {
		t.Fatalf("tokens ls:\n%s", out)
	}

	// top: two redraws of jobs, their workers, pool and the autoscaler's latest decision.
	testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		ds, err := admin.Decisions(context.Background(), 1)
		if err != nil || len(ds) == 0 {
			return fmt.Errorf("no decision yet (%v)", err)
		}
		if p, err := admin.Pool(context.Background()); err != nil || p.Placed != 1 {
			return fmt.Errorf("not placed yet (%v)", err)
		}
		return nil
	})
	out = mustCLI(t, st, topCmd, "--iterations", "2", "--interval", "100ms")
	if n := strings.Count(out, "\x1b[H\x1b[2J"); n != 2 {
		t.Fatalf("top redrew %d times:\n%s", n, out)
	}
	for _, want := range []string{"JOBS  1 (1 running)", "tiny", "WORKERS\n", "2/1", "POOL  2 runtimes", "rt-1", "AUTOSCALER"} {
		if !strings.Contains(out, want) {
			t.Fatalf("top lacks %q:\n%s", want, out)
		}
	}
	// A team token sees its own jobs and no pool.
	cmd := topCmd()
	var buf bytes.Buffer
	cmd.SetOut(&buf)
	cmd.SetArgs([]string{"--api", st.HTTPURL, "--token", tok, "--iterations", "1", "--plain"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "JOBS  0") || strings.Contains(buf.String(), "POOL") {
		t.Fatalf("top with a team token:\n%s", buf.String())
	}
	if !regexp.MustCompile(`(?m)^tiny\s+w1\s+gpu-1\s+0\s+7\s`).MatchString(out) {
		t.Fatalf("top lacks worker w1 of tiny with its rank:\n%s", out)
	}

	if out = mustCLI(t, st, jobsCmd, "rm", "tiny"); !strings.Contains(out, "deleted tiny") {
		t.Fatalf("jobs rm:\n%s", out)
	}
	if _, err := cli(t, st, jobsCmd, "get", "tiny"); err == nil || !strings.Contains(err.Error(), "job_not_found") {
		t.Fatalf("get after rm: %v", err)
	}
	// Without a token: refused.
	cmd = jobsCmd()
	cmd.SetArgs([]string{"ls", "--api", st.HTTPURL, "--token", "nope"})
	cmd.SetOut(&buf)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.ExecuteContext(context.Background()); err == nil || !strings.Contains(err.Error(), "401 unauthorized") {
		t.Fatalf("a wrong token: %v", err)
	}
}

// putAssignment writes a job's elastic workers' assignment as the autoscaler leader would.
func putAssignment(t *testing.T, st *devstack.Stack, a wire.Assignment) {
	t.Helper()
	nc, err := st.Connect("test-assign")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), wire.AssignBucket)
	if err != nil {
		t.Fatal(err)
	}
	val, _ := json.Marshal(a)
	if _, err := kv.Put(context.Background(), a.Job, val); err != nil {
		t.Fatal(err)
	}
}

// fanin auth init writes what an external server and the components need.
func TestAuthInit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := authCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"init", "--dir", dir})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"nats-server.conf", "nats-auth.conf", "gateway.creds", "runtime.creds", "autoscaler.creds", "operator.creds", "admin.token", "signer.nk"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, err, fi)
		}
	}
	conf, _ := os.ReadFile(filepath.Join(dir, "nats-auth.conf"))
	if !strings.Contains(string(conf), "type: full") || !strings.Contains(string(conf), "system_account:") {
		t.Fatalf("server security configuration:\n%s", conf)
	}
	// nats-server refuses an absolute include: the whole configuration includes the fragment by a
	// path relative to itself. (e2e TestSecuredCluster runs a real nats-server with it.)
	server, _ := os.ReadFile(filepath.Join(dir, "nats-server.conf"))
	if !strings.Contains(string(server), `include "nats-auth.conf"`) {
		t.Fatalf("server configuration:\n%s", server)
	}
	tok, _ := os.ReadFile(filepath.Join(dir, "admin.token"))
	if strings.Contains(out.String(), strings.TrimSpace(string(tok))) {
		t.Fatal("auth init printed the admin token")
	}
	if want := fmt.Sprintf("dir: %q", filepath.Join(dir, "accounts")); !strings.Contains(string(conf), want) {
		t.Fatalf("server security configuration without --resolver-dir: no %s:\n%s", want, conf)
	}

	// --resolver-dir: the servers' own directory (deploy/kubernetes: on each server's volume); the
	// keys are reused.
	seed, _ := os.ReadFile(filepath.Join(dir, "account.nk"))
	cmd = authCmd()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"init", "--dir", dir, "--resolver-dir", "/data/accounts"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	conf, _ = os.ReadFile(filepath.Join(dir, "nats-auth.conf"))
	if !strings.Contains(string(conf), `dir: "/data/accounts"`) {
		t.Fatalf("server security configuration with --resolver-dir /data/accounts:\n%s", conf)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, "account.nk")); string(again) != string(seed) {
		t.Fatal("auth init --resolver-dir made new keys")
	}
	cmd = authCmd()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"init", "--dir", dir, "--resolver-dir", "data/accounts"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--resolver-dir") {
		t.Fatalf("auth init --resolver-dir data/accounts: %v, want an error for the relative path", err)
	}
}
