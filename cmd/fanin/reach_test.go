package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/lab/testutil"
)

// onLog makes f see every record logged through slog's default logger until the test ends. A test
// that calls it does not run in parallel: it swaps the process's default logger.
func onLog(t *testing.T, f func(slog.Record)) {
	old := slog.Default()
	slog.SetDefault(slog.New(hookHandler{f}))
	t.Cleanup(func() { slog.SetDefault(old) })
}

type hookHandler struct{ f func(slog.Record) }

func (h hookHandler) Enabled(context.Context, slog.Level) bool      { return true }
func (h hookHandler) Handle(_ context.Context, r slog.Record) error { h.f(r); return nil }
func (h hookHandler) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h hookHandler) WithGroup(string) slog.Handler                 { return h }

// A runtime pointed at an address where no NATS listens keeps trying (NATS may start later), says
// so in its log, and, when it stops, names the address and the cause. Not parallel (onLog; and a
// test beside it could start a server on the port FreePort found free).
func TestNATSOutOfReach(t *testing.T) {
	url := fmt.Sprintf("nats://127.0.0.1:%d", testutil.FreePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logged := make(chan string, 1)
	onLog(t, func(r slog.Record) {
		if r.Message == "cannot reach NATS; retrying" {
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "err" {
					select {
					case logged <- a.Value.String():
					default:
					}
				}
				return true
			})
			cancel() // the runtime has said it: stop it
		}
	})
	_, err := execute(ctx, runtimeCmd(), "--nats", url)
	if err == nil || !strings.Contains(err.Error(), "cannot reach NATS at "+url+": ") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("runtime against %s: %v", url, err)
	}
	if cause := <-logged; !strings.Contains(cause, "connection refused") {
		t.Fatalf("logged cause %q", cause)
	}
}

// A component without credentials against a NATS that requires them says it needs --creds.
func TestNATSWithoutCredentials(t *testing.T) {
	ns, err := embed.Start(embed.Config{Port: -1, StoreDir: t.TempDir(), Configure: func(o *server.Options) error {
		o.Username, o.Password = "fanin", "s3cret"
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	onLog(t, func(slog.Record) {})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, mk := range []func() *cobra.Command{runtimeCmd, autoscalerCmd} {
		_, err := execute(ctx, mk(), "--nats", ns.ClientURL())
		if err == nil || !strings.Contains(err.Error(), "Authorization Violation") || !strings.Contains(err.Error(), "--creds") {
			t.Fatalf("%s without credentials: %v", mk().Name(), err)
		}
	}
	// A password in the URL is not printed.
	bad := strings.Replace(ns.ClientURL(), "nats://", "nats://fanin:wrong@", 1)
	_, err = execute(ctx, runtimeCmd(), "--nats", bad)
	if err == nil || !strings.Contains(err.Error(), "refused the user of the URL: nats: Authorization Violation") || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("runtime with a wrong password: %v", err)
	}
}

// fanin dev names its NATS port as taken, at once.
func TestDevNATSPortTaken(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	_, err = execute(context.Background(), devCmd(), "--nats-port", fmt.Sprint(port), "--http", "127.0.0.1:0", "--data-dir", t.TempDir(), "--runtimes", "1")
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("--nats-port %d is taken", port)) {
		t.Fatalf("fanin dev on a taken port: %v", err)
	}
}

// A client command with no gateway at --api says so, and how to point it elsewhere. Not parallel:
// a test beside it could start a server on the port FreePort found free.
func TestNoGateway(t *testing.T) {
	api := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))
	_, err := execute(context.Background(), jobsCmd(), "ls", "--api", api, "--token", "x")
	if err == nil || !strings.Contains(err.Error(), "no fanin gateway at "+api+" (is it running? set the address with --api or FANIN_API)") ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("jobs ls without a gateway: %v", err)
	}
}

// A runtime's registered metrics URL names its listener by the host it is given (a pod's IP on
// Kubernetes, where the pod's name is no DNS name; a NAT's address), else a wildcard listener by
// this host's name and a listener on one address by that address. --metrics-host without
// --metrics is refused, not ignored.
func TestMetricsURLNamesTheGivenHost(t *testing.T) {
	ctx := t.Context()
	url, stop, err := serveMetrics(ctx, "0.0.0.0:0", "10.1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if !strings.HasPrefix(url, "http://10.1.2.3:") || !strings.HasSuffix(url, "/metrics") {
		t.Errorf("with a host: %s", url)
	}
	host, _ := os.Hostname()
	url, stop, err = serveMetrics(ctx, "0.0.0.0:0", "")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if !strings.HasPrefix(url, "http://"+host+":") {
		t.Errorf("without one: %s, want this host's name %s", url, host)
	}
	url, stop, err = serveMetrics(ctx, "127.0.0.1:0", "10.1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if !strings.HasPrefix(url, "http://10.1.2.3:") {
		t.Errorf("one address, with a host: %s", url)
	}
	url, stop, err = serveMetrics(ctx, "127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Errorf("one address: %s", url)
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %s", url, resp.Status)
	}
	_, err = execute(ctx, runtimeCmd(), "--metrics-host", "10.1.2.3")
	if err == nil || !strings.Contains(err.Error(), "--metrics-host names the host of the metrics URL, and --metrics (where it listens) is not set") {
		t.Errorf("--metrics-host without --metrics: %v", err)
	}
}
