package auth_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/lab/testutil"
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

// jobStreams makes, as fanin's gateway would, the streams and record of job j, and pushes its
// account; it returns the account's identity.
func jobStreams(t *testing.T, a *auth.Authority, js jetstream.JetStream, kv jetstream.KeyValue, sys *nats.Conn, j string) auth.JobAccount {
	t.Helper()
	ctx := context.Background()
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
	if _, err := kv.Put(ctx, j, []byte(`{"job":"`+j+`"}`)); err != nil {
		t.Fatal(err)
	}
	acc := auth.JobAccount{Job: j, Created: time.Now(), Ranks: 2}
	accJWT, err := a.JobAccountJWT(acc)
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PushAccountJWT(ctx, sys, accJWT); err != nil {
		t.Fatal(err)
	}
	return acc
}

// A job's credentials reach, through its own account's imports, its own gradient subjects,
// parameters and record, and nothing else: not another job's, not the JetStream API, not fanin's
// state, whatever reply subject a request names. A user not signed by the authority cannot connect.
func TestJobAccountIsolation(t *testing.T) {
	t.Parallel()
	a, err := auth.New()
	if err != nil {
		t.Fatal(err)
	}
	ns := startServer(t, a, nil)
	ctx := context.Background()

	comp, err := a.ComponentCredentials("test-admin")
	if err != nil {
		t.Fatal(err)
	}
	admin := connect(t, ns.ClientURL(), comp, &errRecorder{})
	js, _ := jetstream.New(admin)
	sysCreds, _ := a.SystemCredentials("test-sys")
	sys := connect(t, ns.ClientURL(), sysCreds, &errRecorder{})
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.JobsBucket, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	accA := jobStreams(t, a, js, kv, sys, "a")
	jobStreams(t, a, js, kv, sys, "b")
	secrets, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "fanin-gateway", Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}

	credsA, err := a.JobCredentials(accA, 0)
	if err != nil {
		t.Fatal(err)
	}
	keyA, _ := a.JobAccountKey(accA)
	if got, issuer := a.JobOf(credsA.JWT); got != "a" || issuer != keyA {
		t.Fatalf("JobOf = %q, %q; want a, %q", got, issuer, keyA)
	}
	var errsA errRecorder
	ncA := connect(t, ns.ClientURL(), credsA, &errsA)
	jsA, _ := jetstream.New(ncA)

	// Allowed: publish its own gradients (acknowledged by JetStream across the boundary), read its
	// own parameters (both forms of direct get) and record, receive its pushed parameters.
	ack, err := jsA.Publish(ctx, wire.GradSubject("a", 0), []byte{0, 0, 0, 0})
	if err != nil || ack.Stream != wire.GradStream("a") {
		t.Fatalf("job a publishing its own gradient: %v %+v", err, ack)
	}
	m, err := ncA.Request(wire.DirectGetLast(wire.ParamsStream("a"), wire.ParamsSubject("a", 0)), nil, time.Second)
	if err != nil || string(m.Data) != "params of a" {
		t.Fatalf("job a reading its parameters: %v", err)
	}
	m, err = ncA.Request(wire.DirectGet(wire.ParamsStream("a")), []byte(`{"last_by_subj":"`+wire.ParamsSubject("a", 0)+`"}`), time.Second)
	if err != nil || string(m.Data) != "params of a" {
		t.Fatalf("job a reading its parameters with a request body: %v", err)
	}
	if m, err = ncA.Request(wire.JobRecordGet("a"), nil, time.Second); err != nil || string(m.Data) != `{"job":"a"}` {
		t.Fatalf("job a reading its record: %v", err)
	}
	subA, err := ncA.SubscribeSync(wire.ParamsWildcard("a"))
	if err != nil {
		t.Fatal(err)
	}
	_ = ncA.Flush()
	if _, err := js.Publish(ctx, wire.ParamsSubject("a", 0), []byte("params of a, step 1")); err != nil {
		t.Fatal(err)
	}
	if m, err := subA.NextMsg(2 * time.Second); err != nil || string(m.Data) != "params of a, step 1" {
		t.Fatalf("job a did not receive its pushed parameters: %v", err)
	}

	// Denied: another job's gradients, parameters (push, direct get) and record; the JetStream API.
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := jsA.Publish(short, wire.GradSubject("b", 0), []byte{0, 0, 0, 0}); err == nil {
		t.Fatal("job a published to job b's gradients")
	}
	subB, _ := ncA.SubscribeSync(wire.ParamsWildcard("b"))
	_ = ncA.Flush()
	_, _ = js.Publish(ctx, wire.ParamsSubject("b", 0), []byte("params of b, again"))
	if m, err := subB.NextMsg(300 * time.Millisecond); err == nil {
		t.Fatalf("job a received job b's parameters: %q", m.Data)
	}
	for _, subj := range []string{
		wire.DirectGetLast(wire.ParamsStream("b"), wire.ParamsSubject("b", 0)),
		wire.JobRecordGet("b"),
		"$JS.API.INFO",
		"$JS.API.STREAM.INFO." + wire.GradStream("a"),
		"$JS.API.STREAM.DELETE." + wire.GradStream("b"),
		"$JS.API.STREAM.PURGE." + wire.GradStream("a"),
		"$JS.API.CONSUMER.CREATE." + wire.ParamsStream("a"),
		"$JS.API.DIRECT.GET.KV_fanin-gateway",
	} {
		if m, err := ncA.Request(subj, []byte(`{}`), 300*time.Millisecond); err == nil && !strings.Contains(string(m.Data), `"error"`) {
			t.Fatalf("job a: %s answered %q", subj, m.Data)
		}
	}

	// Reply subjects cannot cross the boundary: JetStream's answers to job a's requests land in job
	// a's account, whatever reply subject they name. Aimed at fanin's buckets, another job's
	// parameters and record, and the JetStream API, none of them changes anything.
	spy, err := admin.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	_ = admin.Flush()
	targets := []string{
		"$KV.fanin-gateway.token.deadbeef",
		"$KV." + wire.JobsBucket + ".b",
		wire.ParamsSubject("b", 0),
		"$JS.API.STREAM.DELETE." + wire.GradStream("b"),
		"$JS.API.STREAM.PURGE." + wire.ParamsStream("b"),
	}
	for _, target := range targets {
		if err := ncA.PublishRequest(wire.GradSubject("a", 0), target, []byte{0, 0, 0, 0}); err != nil {
			t.Fatal(err)
		}
		if err := ncA.PublishRequest(wire.DirectGetLast(wire.ParamsStream("a"), wire.ParamsSubject("a", 0)), target, nil); err != nil {
			t.Fatal(err)
		}
	}
	_ = ncA.Flush()
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		m, err := spy.NextMsg(100 * time.Millisecond)
		if err != nil {
			continue
		}
		for _, target := range targets {
			if m.Subject == target {
				t.Fatalf("a reply crossed into the fanin account on %s: %q", target, m.Data)
			}
		}
	}
	for _, j := range []string{"a", "b"} {
		for _, name := range []string{wire.GradStream(j), wire.ParamsStream(j)} {
			if _, err := js.Stream(ctx, name); err != nil {
				t.Fatalf("stream %s: %v", name, err)
			}
		}
	}
	if e, err := kv.Get(ctx, "b"); err != nil || string(e.Value()) != `{"job":"b"}` {
		t.Fatalf("job b's record changed: %v", err)
	}
	psB, _ := js.Stream(ctx, wire.ParamsStream("b"))
	if m, err := psB.GetLastMsgForSubject(ctx, wire.ParamsSubject("b", 0)); err != nil || string(m.Data) != "params of b, again" {
		t.Fatalf("job b's parameters changed: %v", err)
	}
	if _, err := secrets.Get(ctx, "token.deadbeef"); err == nil {
		t.Fatal("a token was written into the gateway's bucket")
	}

	// Credentials of another authority do not connect, nor does anyone without credentials.
	other, _ := auth.New()
	foreign, _ := other.JobCredentials(accA, 0)
	if nc, err := nats.Connect(ns.ClientURL(), foreign.NATSOptions()...); err == nil {
		nc.Close()
		t.Fatal("credentials of a foreign authority connected")
	}
	if nc, err := nats.Connect(ns.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("connected without credentials")
	}
}

// A job account with an activation token for another job's subjects is refused: the activation
// names both the account and the subject, and only the authority signs it.
func TestActivationIsPerJob(t *testing.T) {
	t.Parallel()
	a, _ := auth.New()
	accA := auth.JobAccount{Job: "a", Created: time.Now()}
	accB := auth.JobAccount{Job: "b", Created: time.Now()}
	ka, _ := a.JobAccountKey(accA)
	kb, _ := a.JobAccountKey(accB)
	if ka == kb {
		t.Fatal("two jobs share an account key")
	}
	again := accA
	again.Created = accA.Created.Add(time.Nanosecond)
	if k, _ := a.JobAccountKey(again); k == ka {
		t.Fatal("a re-created job has its old account key")
	}
	j, err := a.JobAccountJWT(accA)
	if err != nil {
		t.Fatal(err)
	}
	ac, err := jwt.DecodeAccountClaims(j)
	if err != nil {
		t.Fatal(err)
	}
	if ac.Limits.IsJSEnabled() {
		t.Fatal("a job account has JetStream of its own")
	}
	for _, im := range ac.Imports {
		if !strings.Contains(string(im.Subject), "fanin.v1.a.") && !strings.Contains(string(im.Subject), "FANIN_PARAMS_a") && !strings.HasSuffix(string(im.Subject), ".a") {
			t.Fatalf("job a imports %s", im.Subject)
		}
		act, err := jwt.DecodeActivationClaims(im.Token)
		if err != nil || act.Subject != ka || act.ImportSubject != im.Subject {
			t.Fatalf("activation of %s: %v %+v", im.Subject, err, act)
		}
	}
}

// Deleting a job closes its account: its workers are disconnected and cannot connect again.
func TestClosedJobAccount(t *testing.T) {
	t.Parallel()
	a, _ := auth.New()
	ns := startServer(t, a, nil)
	sysCreds, _ := a.SystemCredentials("test-sys")
	sys := connect(t, ns.ClientURL(), sysCreds, &errRecorder{})
	acc := auth.JobAccount{Job: "a", Created: time.Now(), Ranks: 1}
	j, _ := a.JobAccountJWT(acc)
	if err := auth.PushAccountJWT(context.Background(), sys, j); err != nil {
		t.Fatal(err)
	}
	creds, _ := a.JobCredentials(acc, 0)
	nc := connect(t, ns.ClientURL(), creds, &errRecorder{})
	closed, err := a.ClosedJobAccountJWT(acc, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.PushAccountJWT(context.Background(), sys, closed); err != nil {
		t.Fatal(err)
	}
	testutil.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if nc.IsConnected() {
			return errors.New("a deleted job's worker is still connected")
		}
		return nil
	})
	if c, err := nats.Connect(ns.ClientURL(), creds.NATSOptions()...); err == nil {
		c.Close()
		t.Fatal("a deleted job's credentials connected again")
	}
}

// Revoking a component user of the fanin account, pushed over the system account, disconnects it.
func TestRevoke(t *testing.T) {
	t.Parallel()
	a, _ := auth.New()
	ns := startServer(t, a, nil)
	creds, _ := a.ComponentCredentials("a-component")
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
	testutil.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
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
	t.Parallel()
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
