package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// TestSecuredCluster runs fanin secured as in production: `fanin auth init` writes the keys and
// credentials, a NATS server trusts them (operator mode), and the gateway (--auth-dir), the
// autoscaler and a runtime (--creds) run as processes. A job created through the API trains with
// the credentials returned at its creation, and those credentials do not reach another job;
// without credentials nothing connects; the CLI works with the admin token and not without.
func TestSecuredCluster(t *testing.T) {
	skipShort(t)
	sc := startSecured(t, "rt-0")
	a, url, api, dir, gw := sc.auth, sc.url, sc.api, sc.dir, sc.gateway
	if nc, err := nats.Connect(url); err == nil {
		nc.Close()
		t.Fatal("connected to the secured server without credentials")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := sdk.NewAdmin(api).Jobs(ctx); !errors.Is(err, wire.ErrReason(wire.ReasonUnauthorized)) {
		t.Fatalf("the API without a token: %v", err)
	}
	admin := sdk.NewAdmin(api, sdk.WithToken(a.AdminToken()))
	spec := job.Spec{ID: "sec", Ranks: 2, Tensors: []job.Tensor{{Name: "w", Shape: []int{3000}}},
		Function: job.Function{Name: "adam", Hyper: map[string]float64{"lr": 0.01}}, ShardSize: 4 << 10}
	created, err := admin.SubmitJob(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	spec.ID = "other"
	if _, err := admin.SubmitJob(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if created.Token == "" || created.Credentials == nil {
		t.Fatalf("no token or credentials: %+v", created)
	}

	// Two workers train 20 steps with the job's credentials.
	errc := make(chan error, 2)
	for r := range 2 {
		go func() {
			c, err := sdk.Connect(ctx, url, sdk.WithJobCredentials(created.Credentials))
			if err != nil {
				errc <- err
				return
			}
			defer c.Close()
			w, err := c.Worker(ctx, "sec", r)
			if err != nil {
				errc <- err
				return
			}
			defer w.Close()
			_, params, err := w.Params(ctx)
			if err != nil {
				errc <- err
				return
			}
			g := make([]float32, len(params))
			for step := 1; step <= 20; step++ {
				for i := range g {
					g[i] = 0.01 * float32(r+1)
				}
				if params, err = w.Step(ctx, g); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatalf("training with the job's credentials: %v", err)
		}
	}

	// The same credentials cannot open the other job (the server's refusals are expected here).
	quiet := sdk.WithNATSOptions(nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	c, err := sdk.Connect(ctx, url, sdk.WithJobCredentials(created.Credentials), quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	if _, err := c.Worker(short, "other", 0); err == nil {
		t.Fatal("job sec's credentials opened job other")
	}

	// The CLI: with the admin token it lists both jobs; with the job's token, its own.
	ls := start(t, "jobs ls", "jobs", "ls", "--api", api, "--token", a.AdminToken())
	if err := ls.wait(t, 30*time.Second); err != nil || !strings.Contains(ls.output(), "sec ") || !strings.Contains(ls.output(), "other ") {
		t.Fatalf("fanin jobs ls: %v\n%s", err, ls.output())
	}
	ls = start(t, "jobs ls (job token)", "jobs", "ls", "--api", api, "--token", created.Token, "-o", "json")
	if err := ls.wait(t, 30*time.Second); err != nil || strings.Contains(ls.output(), `"other"`) {
		t.Fatalf("fanin jobs ls with the job's token: %v\n%s", err, ls.output())
	}
	bad := start(t, "jobs ls (no token)", "jobs", "ls", "--api", api, "--token", "fanin_job_nope")
	if err := bad.wait(t, 30*time.Second); err == nil || !strings.Contains(bad.output(), "unauthorized") {
		t.Fatalf("fanin jobs ls with a wrong token: %v\n%s", err, bad.output())
	}
	if conf, _ := os.ReadFile(filepath.Join(dir, "nats-auth.conf")); !bytes.Contains(conf, []byte("resolver_preload")) {
		t.Fatal("no server configuration")
	}
	if strings.Contains(gw.output(), a.AdminToken()) || strings.Contains(gw.output(), created.Credentials.Seed) {
		t.Fatal("the gateway logged a secret")
	}
}

// startSecured runs fanin secured as `fanin auth init` sets it up: the keys and a NATS
// configuration written by auth init, a real nats-server with that configuration (`nats-server -c
// DIR/nats-server.conf`, the port moved off 4222 for the test), the gateway (--auth-dir), the
// autoscaler and the runtimes named (--creds) as processes.
func startSecured(t *testing.T, runtimes ...string) *securedCluster {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "auth")
	initOut := start(t, "auth init", "auth", "init", "--dir", dir)
	if err := initOut.wait(t, 30*time.Second); err != nil {
		t.Fatalf("fanin auth init: %v\n%s", err, initOut.output())
	}
	a, err := auth.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	port := testutil.FreePort(t)
	natsProc := startProc(t, "nats-server", nil, natsServerBin, "-c", filepath.Join(dir, "nats-server.conf"), "-p", strconv.Itoa(port))
	natsProc.waitOutput(t, regexp.MustCompile(`Server is ready`), 30*time.Second)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	gw := start(t, "gateway", "gateway", "--nats", url, "--http", "127.0.0.1:0", "--auth-dir", dir)
	api := gw.waitFor(t, httpURL, 20*time.Second)
	start(t, "autoscaler", "autoscaler", "--nats", url, "--interval", "200ms", "--creds", filepath.Join(dir, "autoscaler.creds"))
	for _, id := range runtimes {
		start(t, id, "runtime", "--nats", url, "--id", id, "--creds", filepath.Join(dir, "runtime.creds"))
	}
	return &securedCluster{auth: a, dir: dir, url: url, api: api, gateway: gw}
}

// securedCluster is what startSecured started.
type securedCluster struct {
	auth          *auth.Authority
	dir, url, api string // auth init's directory, the NATS URL, the API's
	gateway       *proc
}
