package auth_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/wire"
)

func startServer(t *testing.T, a *auth.Authority, onViolation func(embed.Violation)) *server.Server {
	t.Helper()
	ns, err := embed.Start(embed.Config{Port: -1, StoreDir: t.TempDir(), Configure: a.ConfigureServer, OnViolation: onViolation})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

// errRecorder collects a connection's asynchronous errors (permissions violations).
type errRecorder struct {
	mu   sync.Mutex
	errs []error
}

func (r *errRecorder) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	r.mu.Lock()
	r.errs = append(r.errs, err)
	r.mu.Unlock()
}

func (r *errRecorder) has(substr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.errs {
		if strings.Contains(e.Error(), substr) {
			return true
		}
	}
	return false
}

func connect(t *testing.T, url string, c auth.Credentials, rec *errRecorder) *nats.Conn {
	t.Helper()
	opts := append(c.NATSOptions(), nats.ErrorHandler(rec.handler))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// A job's credentials reach its own gradient subjects and parameters and nothing else: the server
// denies publishing to another job's gradients and reading its parameters, by subscription or by
// direct get. A user not signed by the authority cannot connect at all.
func TestJobCredentialsIsolation(t *testing.T) {
	a, err := auth.New()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var violations []embed.Violation
	ns := startServer(t, a, func(v embed.Violation) { mu.Lock(); violations = append(violations, v); mu.Unlock() })
	ctx := context.Background()

	// fanin's side: a component user creates both jobs' streams and parameters.
	comp, err := a.ComponentCredentials("test-admin")
	if err != nil {
		t.Fatal(err)
	}
	admin := connect(t, ns.ClientURL(), comp, &errRecorder{})
	js, _ := jetstream.New(admin)
	for _, j := range []string{"a", "b"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.GradStream(j), Subjects: []string{wire.GradWildcard(j)}, Storage: jetstream.MemoryStorage}); err != nil {
			t.Fatal(err)
		}
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.ParamsStream(j), Subjects: []string{wire.ParamsWildcard(j), wire.CkptWildcard(j)},
			Storage: jetstream.MemoryStorage, AllowDirect: true, MaxMsgsPerSubject: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, wire.ParamsSubject(j, 0), []byte("params of "+j)); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.JobsBucket, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = kv.Put(ctx, "a", []byte(`{"job":"a"}`))
	_, _ = kv.Put(ctx, "b", []byte(`{"job":"b"}`))

	credsA, err := a.JobCredentials("a", false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.JobOf(credsA.JWT); got != "a" {
		t.Fatalf("JobOf = %q, want a", got)
	}
	var errsA errRecorder
	ncA := connect(t, ns.ClientURL(), credsA, &errsA)
	jsA, _ := jetstream.New(ncA)

	// Allowed: publish its own gradients (acknowledged), read its own record and parameters.
	if _, err := jsA.Publish(ctx, wire.GradSubject("a", 0), []byte{0, 0, 0, 0}); err != nil {
		t.Fatalf("job a publishing its own gradient: %v", err)
	}
	psA, err := jsA.Stream(ctx, wire.ParamsStream("a"))
	if err != nil {
		t.Fatalf("job a opening its parameter stream: %v", err)
	}
	if m, err := psA.GetLastMsgForSubject(ctx, wire.ParamsSubject("a", 0)); err != nil || string(m.Data) != "params of a" {
		t.Fatalf("job a reading its parameters: %v", err)
	}
	kvA, err := jsA.KeyValue(ctx, wire.JobsBucket)
	if err != nil {
		t.Fatalf("job a opening the jobs bucket: %v", err)
	}
	if _, err := kvA.Get(ctx, "a"); err != nil {
		t.Fatalf("job a reading its record: %v", err)
	}
	subA, err := ncA.SubscribeSync(wire.ParamsWildcard("a"))
	if err != nil {
		t.Fatal(err)
	}
	_ = subA

	// Denied: another job's gradients, parameters (push, direct get, stream info), record.
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := jsA.Publish(short, wire.GradSubject("b", 0), []byte{0, 0, 0, 0}); err == nil {
		t.Fatal("job a published to job b's gradients")
	}
	if _, err := js.Stream(ctx, wire.GradStream("b")); err != nil {
		t.Fatal(err)
	}
	if info, _ := js.Stream(ctx, wire.GradStream("b")); info.CachedInfo().State.Msgs != 0 {
		t.Fatal("job b's gradient stream holds a message from job a")
	}
	subB, _ := ncA.SubscribeSync(wire.ParamsWildcard("b"))
	_ = ncA.Flush()
	_, _ = js.Publish(ctx, wire.ParamsSubject("b", 0), []byte("params of b, again"))
	if m, err := subB.NextMsg(300 * time.Millisecond); err == nil {
		t.Fatalf("job a received job b's parameters: %q", m.Data)
	}
	if _, err := ncA.Request("$JS.API.DIRECT.GET."+wire.ParamsStream("b")+"."+wire.ParamsSubject("b", 0), nil, 300*time.Millisecond); err == nil {
		t.Fatal("job a read job b's parameters by direct get")
	}
	if _, err := kvA.Get(short, "b"); err == nil {
		t.Fatal("job a read job b's record")
	}
	// Another job's inboxes are out of reach too.
	if _, err := ncA.SubscribeSync(auth.InboxPrefix("b") + ".>"); err != nil {
		t.Fatal(err)
	}
	_ = ncA.Flush()
	testCheck(t, func() error {
		for _, want := range []string{
			`Publish to "fanin.v1.b.grad.0"`, `Subscription to "fanin.v1.b.params.*"`,
			`Publish to "$JS.API.DIRECT.GET.FANIN_PARAMS_b`, `Subscription to "_INBOX_b.>"`,
		} {
			if !errsA.has(want) {
				return errors.New("no permissions violation " + want)
			}
		}
		return nil
	})
	testCheck(t, func() error {
		mu.Lock()
		defer mu.Unlock()
		for _, v := range violations {
			if v.User == credsA.User && v.Kind == "Publish" && v.Subject == wire.GradSubject("b", 0) {
				return nil
			}
		}
		return errors.New("the server's violation of job a publishing to b was not reported")
	})

	// Credentials of another authority do not connect.
	other, _ := auth.New()
	foreign, _ := other.JobCredentials("a", false, 0)
	if nc, err := nats.Connect(ns.ClientURL(), foreign.NATSOptions()...); err == nil {
		nc.Close()
		t.Fatal("credentials of a foreign authority connected")
	}
	// Nor does anyone without credentials.
	if nc, err := nats.Connect(ns.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("connected without credentials")
	}
}

// Revoking a job's user, pushed over the system account, disconnects it and keeps it out.
func TestRevoke(t *testing.T) {
	a, _ := auth.New()
	ns := startServer(t, a, nil)
	creds, _ := a.JobCredentials("a", false, 0)
	nc := connect(t, ns.ClientURL(), creds, &errRecorder{})
	sysCreds, err := a.SystemCredentials("test-sys")
	if err != nil {
		t.Fatal(err)
	}
	sys := connect(t, ns.ClientURL(), sysCreds, &errRecorder{})
	accJWT, err := a.Revoke(time.Now().Add(time.Second), creds.User)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.PushAccount(context.Background(), sys, accJWT); err != nil {
		t.Fatal(err)
	}
	testCheck(t, func() error {
		if nc.IsConnected() {
			return errors.New("a revoked user is still connected")
		}
		return nil
	})
	if c, err := nats.Connect(ns.ClientURL(), creds.NATSOptions()...); err == nil {
		c.Close()
		t.Fatal("a revoked user connected again")
	}
	if got := a.Revoked(); len(got) != 1 || got[0] != creds.User {
		t.Fatalf("Revoked() = %v", got)
	}
}

// Load keeps the keys and the admin token: the same directory gives the same account.
func TestLoadPersists(t *testing.T) {
	dir := t.TempDir()
	a, err := auth.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := auth.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a.AccountKey() != b.AccountKey() || a.AdminToken() != b.AdminToken() || !strings.HasPrefix(a.AdminToken(), "fanin_admin_") {
		t.Fatal("a reloaded authority differs")
	}
	if !auth.Equal(a.AdminToken(), b.AdminToken()) || auth.Equal(a.AdminToken(), a.AdminToken()+"x") {
		t.Fatal("Equal")
	}
	if r := auth.Redact(a.AdminToken()); strings.Contains(r, a.AdminToken()[16:]) {
		t.Fatalf("Redact leaks the token: %s", r)
	}
}

func testCheck(t *testing.T, f func() error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
