package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// TestAttacks runs `fanin dev` (secured, as it is by default) as a process and attacks it with the
// suite of runAttacks. TestKubeNode runs the same suite against the Kubernetes deployment.
func TestAttacks(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	natsPort, httpPort := testutil.FreePort(t), testutil.FreePort(t)
	dev := start(t, "fanin dev", "dev", "--nats-port", strconv.Itoa(natsPort), "--http", "127.0.0.1:"+strconv.Itoa(httpPort),
		"--data-dir", dir, "--runtimes", "2", "--log-level", "warn")
	dev.waitFor(t, regexpHTTP, 60*time.Second)
	httpURL := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	authority, err := auth.Load(filepath.Join(dir, "auth"))
	if err != nil {
		t.Fatal(err)
	}
	observer, err := authority.ComponentCredentials("e2e-observer")
	if err != nil {
		t.Fatal(err)
	}
	runAttacks(t, attackTarget{
		natsURL:  fmt.Sprintf("nats://127.0.0.1:%d", natsPort),
		apiURL:   httpURL,
		admin:    sdk.NewAdmin(httpURL, sdk.WithToken(authority.AdminToken())),
		observer: observer.NATSOptions(),
		// fanin dev serves its runtimes' metrics on its HTTP API.
		metrics: func() ([]string, error) { return []string{httpURL + "/metrics"}, nil },
		memory: func() (int64, error) {
			return rssOf(dev.cmd.Process.Pid)
		},
		memoryOf: "fanin dev's RSS (NATS, runtimes, gateway and autoscaler in one process)",
	})
}

// attackTarget is a deployment of fanin that runAttacks attacks.
type attackTarget struct {
	natsURL string // where jobs' workers connect
	apiURL  string // the HTTP API
	admin   *sdk.Admin
	// observer connects a component user of fanin's account: fanin's own view, to check what an
	// attack changed.
	observer []nats.Option
	// metrics lists the Prometheus endpoints of the runtimes (counters are summed over them).
	metrics func() ([]string, error)
	// memory is the resident memory, in bytes, of the processes an attack could make grow
	// (memoryOf names them); nil when the target cannot measure it, and noMemory says why.
	memory   func() (int64, error)
	memoryOf string
	noMemory string
}

// runAttacks attacks tg with nothing but one job's NATS credentials, one class of attack per
// subtest, while two victim jobs train alongside, each step checked against the single-process
// reference. Every attack is denied or rejected with its reason; after each one, both victims have
// trained on, bit-exact, and so has the attacker's own job (its own workers, its own reference);
// at the end the victims' parameters are byte-identical to the reference and the target's memory
// stayed bounded. The suite deletes its jobs when it ends.
func runAttacks(t *testing.T, tg attackTarget) {
	url, httpURL, admin := tg.natsURL, tg.apiURL, tg.admin
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	comp, err := nats.Connect(url, tg.observer...)
	if err != nil {
		t.Fatal(err)
	}
	defer comp.Close()
	cjs, _ := jetstream.New(comp)

	// Two victims train for the whole run; the attacker has jobs of its own.
	v1 := startVictim(t, ctx, admin, url, "victim-sgd", "sgd", map[string]float64{"lr": 0.1})
	v2 := startVictim(t, ctx, admin, url, "victim-adam", "adam", map[string]float64{"lr": 0.01})
	attacker := submit(t, ctx, admin, attackSpec("attacker", "zeros"))
	forger := submit(t, ctx, admin, attackSpec("forger", "upload"))
	defer func() {
		for _, id := range []string{v1.rec.Spec.ID, v2.rec.Spec.ID, attacker.Record.Spec.ID, forger.Record.Spec.ID} {
			if err := admin.DeleteJob(context.Background(), id); err != nil {
				t.Errorf("deleting job %s: %v", id, err)
			}
		}
	}()
	quiet := sdk.WithNATSOptions(nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	// The attacker's own job, trained by its own workers between the attacks.
	atr := newTrainerWith(t, url, &attacker.Record, []sdk.Option{sdk.WithJobCredentials(attacker.Credentials), quiet})
	ac := connectAs(t, url, attacker.Credentials)
	ajs, _ := jetstream.New(ac.nc)
	var mem0 int64
	if tg.memory != nil {
		if mem0, err = tg.memory(); err != nil {
			t.Fatal(err)
		}
	}
	runtimeID := "rt-0"
	if pool, err := admin.Pool(ctx); err == nil && len(pool.Runtimes) > 0 {
		runtimeID = pool.Runtimes[0].ID
	}
	dropped := func(t *testing.T, jobID string) float64 {
		t.Helper()
		urls, err := tg.metrics()
		if err != nil {
			t.Fatal(err)
		}
		sum := 0.0
		for _, u := range urls {
			sum += metricSum(t, u, metrics.RuntimeRepliesDropped, jobID)
		}
		return sum
	}

	// Everything that lands in the fanin account, to check that no attack published there: the
	// answers to requests (what JetStream sends a reply subject), and the rejection reports apart.
	// Other messages on those subjects are fanin's own traffic: a victim's parameters and
	// checkpoints, the autoscaler's placement of its shards.
	var spyMu sync.Mutex
	landed, reportsLanded := map[string]int{}, map[string]int{}
	spy, err := comp.Subscribe(">", func(m *nats.Msg) {
		if !isAnswer(m, attacker.Record.Spec.ID) {
			return
		}
		spyMu.Lock()
		landed[m.Subject]++
		if m.Header.Get(wire.HdrReject) != "" {
			reportsLanded[m.Subject]++
		}
		spyMu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Unsubscribe()
	_ = spy.SetPendingLimits(-1, -1) // the victims' traffic passes here too: drop nothing
	sawLanded := func(subject string) int {
		_ = comp.Flush()
		spyMu.Lock()
		defer spyMu.Unlock()
		return landed[subject]
	}
	sawReport := func(subject string) int {
		_ = comp.Flush()
		spyMu.Lock()
		defer spyMu.Unlock()
		return reportsLanded[subject]
	}

	// The attacker's bad messages stay in its stream until a snapshot of its shard covers them, and
	// its stream holds at most ranks x shards x 8 messages (its storage bound): each class of attack
	// starts from an empty stream, as a job that trains would keep it, and so does the attacker's
	// own training after each.
	clearAttacker := func(t *testing.T) {
		t.Helper()
		gs, err := cjs.Stream(ctx, wire.GradStream(attacker.Record.Spec.ID))
		if err == nil {
			err = gs.Purge(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// next is the attacker's shards' next step: a gradient for it is judged now, not kept for later.
	next := func() int64 { return atr.step + 1 }

	// attack runs one class of attack, then checks that it took nothing away from anyone: both
	// victims train on (each step checked against their reference as they go), and so does the
	// attacker's own job. The check is a subtest of its own: the attacker's trainer stops at a
	// failure of its test, and an attack's failure must not look like one of the training's.
	attack := func(name string, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			t.Run("attack", f)
			t.Run("then every job trains on, bit-exact", func(t *testing.T) {
				for _, v := range []*victim{v1, v2} {
					v.trainsOn(t, 2)
				}
				clearAttacker(t)
				atr.t = t
				atr.run(atr.step + 3)
			})
		})
	}

	attack("reply subjects cannot cross the account boundary", func(t *testing.T) {
		token := "fanin_admin_" + strings.Repeat("x", 43)
		sum := sha256.Sum256([]byte(token))
		targets := []string{
			"$KV." + gateway.StateBucket + ".token." + hex.EncodeToString(sum[:]),
			"$KV." + wire.JobsBucket + "." + v1.rec.Spec.ID,
			"$KV." + wire.PlacementBucket + "." + wire.PlacementKey(v1.rec.Spec.ID, 0),
			"$KV." + wire.RuntimesBucket + "." + runtimeID,
			"$KV." + wire.HandoverBucket + "." + wire.PlacementKey(v1.rec.Spec.ID, 0),
			"$KV." + wire.LeaderBucket + ".leader",
			"$KV." + wire.PolicyBucket + ".policy",
			"$KV." + wire.AssignBucket + "." + v1.rec.Spec.ID,
			wire.WorkersSubject(v1.rec.Spec.ID),
			"$JS.API.STREAM.DELETE." + wire.GradStream(v1.rec.Spec.ID),
			"$JS.API.STREAM.PURGE." + wire.ParamsStream(v2.rec.Spec.ID),
			"$JS.API.STREAM.MSG.DELETE." + wire.ParamsStream(v1.rec.Spec.ID),
			"$JS.API.CONSUMER.CREATE." + wire.ParamsStream(v1.rec.Spec.ID),
			"$JS.API.STREAM.DELETE.KV_" + wire.JobsBucket,
			wire.ParamsSubject(v1.rec.Spec.ID, 0),
			wire.GradSubject(v2.rec.Spec.ID, 0),
			wire.CkptSubject(v2.rec.Spec.ID, 0),
			wire.RejectsSubject(v1.rec.Spec.ID),
		}
		id := attacker.Record.Spec.ID
		requests := []struct {
			subject string
			data    []byte
		}{
			{wire.GradSubject(id, 0), make([]byte, 16)},
			{wire.DirectGetLast(wire.ParamsStream(id), wire.ParamsSubject(id, 0)), nil},
			{wire.DirectGet(wire.ParamsStream(id)), []byte(`{"last_by_subj":"` + wire.ParamsSubject(id, 0) + `"}`)},
			{wire.JobRecordGet(id), nil},
			{wire.AssignmentGet(id), nil},
			{wire.WorkersSubject(id), []byte(`{"id":"spy"}`)},
		}
		for _, target := range targets {
			for _, rq := range requests {
				if err := ac.nc.PublishRequest(rq.subject, target, rq.data); err != nil {
					t.Fatal(err)
				}
			}
		}
		_ = ac.nc.Flush()
		time.Sleep(300 * time.Millisecond) // answers arrive within milliseconds: give them time to land, if they could
		for _, target := range targets {
			if n := sawLanded(target); n > 0 {
				t.Errorf("%d answer(s) to the attacker's requests landed on %s in the fanin account", n, target)
			}
		}
		if code := httpStatus(t, httpURL+"/v1/whoami", token); code != http.StatusUnauthorized {
			t.Errorf("a token named by a reply subject answered %d", code)
		}
		for _, v := range []*victim{v1, v2} {
			for _, name := range []string{wire.GradStream(v.rec.Spec.ID), wire.ParamsStream(v.rec.Spec.ID)} {
				if _, err := cjs.Stream(ctx, name); err != nil {
					t.Errorf("stream %s: %v", name, err)
				}
			}
		}
		kv, err := cjs.KeyValue(ctx, wire.JobsBucket)
		if err != nil {
			t.Fatal(err)
		}
		if e, err := kv.Get(ctx, v1.rec.Spec.ID); err != nil || !bytes.Contains(e.Value(), []byte(`"id":"victim-sgd"`)) {
			t.Errorf("victim-sgd's record: %v", err)
		}
	})

	attack("Fanin-Reply-To outside the job is dropped and counted", func(t *testing.T) {
		clearAttacker(t)
		id := attacker.Record.Spec.ID
		outside := []string{
			wire.ParamsSubject(v1.rec.Spec.ID, 0),
			wire.InboxPrefix(v2.rec.Spec.ID) + ".stolen",
			"$KV." + wire.JobsBucket + "." + v1.rec.Spec.ID,
			"_INBOX.attacker",
			wire.InboxPrefix(id) + ".*",
			wire.InboxPrefix(id) + ".>",
			wire.InboxPrefix(id),
		}
		victimInbox, err := v2.nc.SubscribeSync(wire.InboxPrefix(v2.rec.Spec.ID) + ".stolen")
		if err != nil {
			t.Fatal(err)
		}
		before := dropped(t, id)
		for i, to := range outside {
			m := badGrad(id, 0, next()+int64(1000+i))
			m.Header.Set(wire.HdrReplyTo, to)
			if _, err := ajs.PublishMsg(ctx, m); err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
		// Every one of them was decided and its reply dropped: the shard is served now, so the
		// next message's report is not waiting for a consumer or a handover.
		testutil.CheckFor(t, time.Minute, 100*time.Millisecond, func() error {
			if got := dropped(t, id); got < before+float64(len(outside)) {
				return fmt.Errorf("%v replies dropped, want %v", got, before+float64(len(outside)))
			}
			return nil
		})
		// A reply inside its own namespace is answered.
		mine := wire.InboxPrefix(id) + ".mine"
		reports, err := ac.nc.SubscribeSync(mine)
		if err != nil {
			t.Fatal(err)
		}
		announced, err := ac.nc.SubscribeSync(wire.RejectsSubject(id)) // each refusal, for observers
		if err != nil {
			t.Fatal(err)
		}
		if err := ac.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		m := badGrad(id, 0, next()) // the shard's next step, so the length is what is wrong
		m.Header.Set(wire.HdrReplyTo, mine)
		if _, err := ajs.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		r, err := reports.NextMsg(time.Minute)
		if err != nil {
			// Tell a refusal decided and its reply lost (a fault) from a message not decided yet.
			n, _, _ := announced.Pending()
			pl, perr := admin.Placement(ctx)
			var shards []string
			for _, p := range pl {
				if p.Job == id {
					shards = append(shards, fmt.Sprintf("%d@%s", p.Shard, p.Runtime))
				}
			}
			t.Fatalf("no report at a reply inside the job: %v (refusals announced on the job's rejects subject meanwhile: %d; its shards' placement: %v %v)", err, n, shards, perr)
		}
		if got := r.Header.Get(wire.HdrReject); got != string(wire.ReasonBadLength) {
			t.Fatalf("a report of %q at a reply inside the job, want %s", got, wire.ReasonBadLength)
		}
		for _, to := range outside {
			if n := sawReport(to); n > 0 {
				t.Errorf("%d rejection report(s) sent to %s", n, to)
			}
		}
		if m, err := victimInbox.NextMsg(200 * time.Millisecond); err == nil {
			t.Errorf("the victim's inbox received %s: %q", m.Subject, m.Data)
		}
	})

	attack("parameters are written only by runtimes", func(t *testing.T) {
		fc := connectAs(t, url, forger.Credentials)
		fjs, _ := jetstream.New(fc.nc)
		id := forger.Record.Spec.ID
		shard := forger.Record.Layout.Shards[0]
		// Its own parameter subjects: denied by the server.
		_ = fc.nc.Publish(wire.ParamsSubject(id, 0), make([]byte, shard.Bytes()))
		fc.awaitViolation(t, `Publish to "`+wire.ParamsSubject(id, 0)+`"`)
		// A bad upload is rejected with its reason and may be sent again.
		nan := make([]byte, shard.Bytes())
		copy(nan[4:], []byte{0, 0, 0xc0, 0x7f})
		rejects, _ := fc.nc.SubscribeSync(wire.RejectsSubject(id))
		if _, err := fjs.PublishMsg(ctx, initMsg(id, shard.ID, nan)); err != nil {
			t.Fatal(err)
		}
		rj, err := rejects.NextMsg(20 * time.Second)
		if err != nil || !bytes.Contains(rj.Data, []byte(wire.ReasonNonFinite)) {
			t.Fatalf("a NaN upload: %v %s", err, rj.Data)
		}
		// Then a good one, for every shard; a second upload is refused at publish.
		c, err := sdk.Connect(ctx, url, sdk.WithJobCredentials(forger.Credentials))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		init := make([]float32, forger.Record.Layout.Elements)
		for i := range init {
			init[i] = float32(i%7) * 0.25
		}
		testutil.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error { return c.UploadParams(ctx, id, init) })
		if _, err := fjs.PublishMsg(ctx, initMsg(id, shard.ID, make([]byte, shard.Bytes()))); err == nil || !strings.Contains(err.Error(), "maximum messages per subject exceeded") {
			t.Fatalf("a second upload: %v", err)
		}
		w, err := c.Worker(ctx, id, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		_, got, err := w.Params(ctx)
		if err != nil || !bytes.Equal(f32le(got), f32le(init)) {
			t.Fatalf("the step-0 parameters are not the first good upload: %v", err)
		}
		// A job that is not init "upload" has no upload subject at all.
		short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
		defer cancelShort()
		if _, err := ajs.PublishMsg(short, initMsg(attacker.Record.Spec.ID, 0, make([]byte, 16))); err == nil {
			t.Fatal("a zeros job uploaded initial parameters")
		}
		ac.awaitViolation(t, `Publish to "`+wire.InitSubject(attacker.Record.Spec.ID, 0)+`"`)
		// The forger's job trains from its upload, bit-exact.
		w.Close()
		ftr := newTrainerWith(t, url, &forger.Record, []sdk.Option{sdk.WithJobCredentials(forger.Credentials), quiet})
		ftr.run(3)
	})

	attack("oversized messages are refused at publish", func(t *testing.T) {
		clearAttacker(t)
		id := attacker.Record.Spec.ID
		shard := attacker.Record.Layout.Shards[0]
		for _, size := range []int{shard.Bytes() + store.MaxGradHeaders + 4, 2 * (shard.Bytes() + store.MaxGradHeaders), 1 << 20, 8 << 20, 31 << 20} {
			m := badGrad(id, 0, next())
			m.Data = make([]byte, size)
			_, err := ajs.PublishMsg(ctx, m)
			if !errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) && !strings.Contains(fmt.Sprint(err), "message size exceeds maximum") {
				t.Errorf("a %d-byte gradient: %v, want it refused for its size", size, err)
			}
		}
		// One element too many fits the stream and is rejected by the runtime as oversized.
		m := badGrad(id, 0, next())
		m.Data = make([]byte, shard.Bytes()+4)
		rejects, _ := ac.nc.SubscribeSync(wire.RejectsSubject(id))
		if _, err := ajs.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		awaitReject(t, rejects, wire.ReasonOversized)
	})

	attack("storage is bounded per job, refused at publish", func(t *testing.T) {
		clearAttacker(t)
		id := attacker.Record.Spec.ID
		shard := attacker.Record.Layout.Shards[0]
		bound, _ := store.JobStorageBound(&attacker.Record)
		var refusal error
		from := next() + 100
		for step := from; step < from+10_000 && refusal == nil; step++ {
			m := badGrad(id, shard.ID, step)
			m.Data = make([]byte, shard.Bytes()) // far-future steps: stored, never applied
			_, refusal = ajs.PublishMsg(ctx, m)
		}
		if refusal == nil || !strings.Contains(refusal.Error(), "maximum") {
			t.Fatalf("10,000 gradients beyond the bound: %v", refusal)
		}
		gs, err := cjs.Stream(ctx, wire.GradStream(id))
		if err != nil {
			t.Fatal(err)
		}
		if st := gs.CachedInfo().State; st.Bytes > uint64(bound) {
			t.Fatalf("the attacker's stream holds %d bytes, beyond its bound %d", st.Bytes, bound)
		}
		t.Logf("refused after the bound (%d bytes): %v", bound, refusal)
	})

	attack("unknown shard ids create nothing per message", func(t *testing.T) {
		clearAttacker(t)
		id := attacker.Record.Spec.ID
		gs, err := cjs.Stream(ctx, wire.GradStream(id))
		if err != nil {
			t.Fatal(err)
		}
		rejects, _ := ac.nc.SubscribeSync(wire.RejectsSubject(id))
		const flood = 3000
		maxConsumers, stored, refused := 0, 0, 0
		for i := range flood {
			m := badGrad(id, 1000+i, next())
			m.Header.Set(wire.HdrMsgID, fmt.Sprintf("flood-%d", i))
			if _, err := ajs.PublishMsg(ctx, m); err != nil {
				refused++
			} else {
				stored++
			}
			if i%100 == 0 {
				info, err := gs.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				maxConsumers = max(maxConsumers, info.State.Consumers)
			}
		}
		// The stored ones are swept: each rejected as unknown_shard with its message id.
		rj := awaitReject(t, rejects, wire.ReasonUnknownShard)
		if rj.MsgID == "" || !strings.HasPrefix(rj.MsgID, "flood-") {
			t.Errorf("an unknown_shard report without the message's id: %+v", rj)
		}
		testutil.CheckFor(t, 60*time.Second, 200*time.Millisecond, func() error {
			info, err := gs.Info(ctx, jetstream.WithSubjectFilter(wire.GradWildcard(id)))
			if err != nil {
				return err
			}
			maxConsumers = max(maxConsumers, info.State.Consumers)
			if len(info.State.Subjects) > 0 {
				return fmt.Errorf("%d unknown shard subjects not swept yet", len(info.State.Subjects))
			}
			return nil
		})
		if maxConsumers > 3 {
			t.Errorf("up to %d consumers on the attacker's stream during a flood of unknown shard ids", maxConsumers)
		}
		t.Logf("%d unknown-shard gradients: %d stored (and swept), %d refused at publish; at most %d consumers", flood, stored, refused, maxConsumers)
	})

	attack("another job's subjects and the JetStream API are out of reach", func(t *testing.T) {
		v := v1.rec.Spec.ID
		_ = ac.nc.Publish(wire.GradSubject(v, 0), make([]byte, 16))
		ac.awaitViolation(t, `Publish to "`+wire.GradSubject(v, 0)+`"`)
		// A beat into another job's membership would take its ranks away from its workers.
		_ = ac.nc.Publish(wire.WorkersSubject(v), []byte(`{"id":"usurper","ranks":[]}`))
		ac.awaitViolation(t, `Publish to "`+wire.WorkersSubject(v)+`"`)
		if _, err := ac.nc.SubscribeSync(wire.ParamsWildcard(v)); err != nil {
			t.Fatal(err)
		}
		ac.awaitViolation(t, `Subscription to "`+wire.ParamsWildcard(v)+`"`)
		for _, subj := range []string{
			wire.DirectGetLast(wire.ParamsStream(v), wire.ParamsSubject(v, 0)),
			wire.JobRecordGet(v),
			wire.AssignmentGet(v),
			"$JS.API.INFO",
			"$JS.API.STREAM.LIST",
			"$JS.API.STREAM.INFO." + wire.GradStream(attacker.Record.Spec.ID),
			"$JS.API.STREAM.DELETE." + wire.GradStream(v),
		} {
			if m, err := ac.nc.Request(subj, []byte(`{}`), 500*time.Millisecond); err == nil && !bytes.Contains(m.Data, []byte(`"error"`)) {
				t.Errorf("%s answered %q", subj, m.Data)
			}
		}
	})

	// The victims trained through all of it, to the reference's bits.
	for _, v := range []*victim{v1, v2} {
		steps := v.stop(t)
		t.Logf("%s trained %d steps alongside the attacks, byte-identical to the reference", v.rec.Spec.ID, steps)
		if steps < 5 {
			t.Errorf("%s trained only %d steps during the attacks", v.rec.Spec.ID, steps)
		}
	}
	t.Logf("the attacker's own job trained %d steps between the attacks, byte-identical to the reference", atr.step)
	if tg.memory == nil {
		t.Logf("memory not checked: %s", tg.noMemory)
		return
	}
	mem1, err := tg.memory()
	if err != nil {
		t.Fatal(err)
	}
	// The attacks' large messages (up to 31 MiB) are read whole by the server they reach.
	t.Logf("the attacker's connection was to server %s", ac.nc.ConnectedServerName())
	t.Logf("%s: %d MiB before the attacks, %d MiB after", tg.memoryOf, mem0>>20, mem1>>20)
	if mem1 > mem0+400<<20 {
		t.Errorf("%s grew from %d to %d MiB during the attacks", tg.memoryOf, mem0>>20, mem1>>20)
	}
}

// isAnswer says whether m looks like JetStream's answer to a request of job attacker: a direct
// get's message or status, an API response or publish acknowledgement, or anything that names the
// attacker's job. fanin's own messages (parameters, checkpoints, KV values) are none of these.
func isAnswer(m *nats.Msg, attacker string) bool {
	if m.Header.Get("Nats-Stream") != "" || m.Header.Get("Status") != "" || m.Header.Get(wire.HdrReject) != "" {
		return true
	}
	if bytes.HasPrefix(m.Data, []byte(`{"stream"`)) || bytes.Contains(m.Data, []byte(`"error":{`)) ||
		bytes.Contains(m.Data, []byte("io.nats.jetstream.api")) || bytes.Contains(m.Data, []byte(attacker)) {
		return true
	}
	for _, vs := range m.Header {
		for _, v := range vs {
			if strings.Contains(v, attacker) {
				return true
			}
		}
	}
	return false
}

// regexpHTTP finds the HTTP API's address in fanin dev's banner.
var regexpHTTP = regexp.MustCompile(`HTTP API +(http://\S+)`)

// victim is a job trained in BSP lockstep by its own workers (with its own credentials), each
// step checked against the single-process reference.
type victim struct {
	rec     *job.Record
	nc      *nats.Conn // a connection with the victim's credentials
	done    chan struct{}
	stopped chan struct{} // closed by the training goroutine when it returns
	steps   atomic.Int64  // the steps trained and checked, written by the training goroutine
	failed  atomic.Bool   // set before the training goroutine returns with err
	err     error         // written by the training goroutine; read after stopped or failed
	ref     *functions.Reference
	final   []float32
}

func startVictim(t *testing.T, ctx context.Context, admin *sdk.Admin, url, id, fn string, hyper map[string]float64) *victim {
	t.Helper()
	spec := job.Spec{ID: id, Ranks: 2, ShardSize: 4 << 10, Tensors: []job.Tensor{{Name: "w", Shape: []int{3000}}},
		Function: job.Function{Name: fn, Hyper: hyper}, Init: job.Init{Kind: "uniform", Seed: 9, Scale: 0.5}}
	created := submit(t, ctx, admin, spec)
	v := &victim{rec: &created.Record, done: make(chan struct{}), stopped: make(chan struct{})}
	v.nc = connectAs(t, url, created.Credentials).nc
	var ws []*sdk.Worker
	for r := range spec.Ranks {
		// Quiet: deleting the job at the end closes its account, and its connections with it.
		c, err := sdk.Connect(ctx, url, sdk.WithJobCredentials(created.Credentials),
			sdk.WithNATSOptions(nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		w, err := c.Worker(ctx, id, r)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	_, init, err := ws[0].Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fnc, _ := created.Record.Spec.NewFunc()
	v.ref = functions.NewReference(fnc, spec.Ranks, created.Record.Layout.Ranges(), init)
	go func() {
		defer close(v.stopped)
		defer func() { v.failed.Store(v.err != nil) }()
		params := append([]float32(nil), init...)
		grads := [][]float32{make([]float32, len(init)), make([]float32, len(init))}
		for step := int64(1); ; step++ {
			select {
			case <-v.done:
				v.final = params
				return
			default:
			}
			var wg sync.WaitGroup
			out := make([][]float32, len(ws))
			errs := make([]error, len(ws))
			for r, w := range ws {
				testutil.Gradient(grads[r], params, step, r)
				wg.Add(1)
				go func() { defer wg.Done(); out[r], errs[r] = w.Step(ctx, grads[r]) }()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				v.err = fmt.Errorf("%s step %d: %w", id, step, err)
				return
			}
			v.ref.Step(grads, nil)
			for r := range out {
				if !bytes.Equal(f32le(out[r]), f32le(v.ref.Params())) {
					v.err = fmt.Errorf("%s step %d: rank %d's parameters differ from the reference", id, step, r)
					return
				}
			}
			params = append(params[:0], out[0]...)
			v.steps.Store(step)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return v
}

// stop ends the victim's training at a step boundary and checks its parameters against the
// reference's; it returns the steps trained.
func (v *victim) stop(t *testing.T) int64 {
	t.Helper()
	close(v.done)
	<-v.stopped
	if v.err != nil {
		t.Fatal(v.err)
	}
	if !bytes.Equal(f32le(v.final), f32le(v.ref.Params())) {
		t.Errorf("%s: after %d steps the parameters differ from the reference", v.rec.Spec.ID, v.steps.Load())
	}
	return v.steps.Load()
}

// trainsOn waits until the victim has trained n more steps, each bit-exact.
func (v *victim) trainsOn(t *testing.T, n int64) {
	t.Helper()
	from := v.steps.Load()
	testutil.CheckFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		if v.failed.Load() {
			return nil
		}
		if got := v.steps.Load(); got < from+n {
			return fmt.Errorf("%s at step %d, want %d", v.rec.Spec.ID, got, from+n)
		}
		return nil
	})
	if v.failed.Load() {
		<-v.stopped
		t.Fatal(v.err)
	}
}

func attackSpec(id, init string) job.Spec {
	return job.Spec{ID: id, Ranks: 1, ShardSize: 4 << 10, Tensors: []job.Tensor{{Name: "w", Shape: []int{2048}}},
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, Init: job.Init{Kind: init}}
}

func submit(t *testing.T, ctx context.Context, admin *sdk.Admin, spec job.Spec) *api.JobCreated {
	t.Helper()
	created, err := admin.SubmitJob(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if created.Credentials == nil {
		t.Fatal("no NATS credentials: is fanin dev secured?")
	}
	return created
}

// attackerConn is a connection with a job's credentials and its permission violations.
type attackerConn struct {
	nc   *nats.Conn
	mu   sync.Mutex
	errs []error
}

func connectAs(t *testing.T, url string, c *api.Credentials) *attackerConn {
	t.Helper()
	a := &attackerConn{}
	nc, err := nats.Connect(url, nats.UserJWTAndSeed(c.JWT, c.Seed), nats.CustomInboxPrefix(c.InboxPrefix),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			a.mu.Lock()
			a.errs = append(a.errs, err)
			a.mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	a.nc = nc
	return a
}

func (a *attackerConn) awaitViolation(t *testing.T, substr string) {
	t.Helper()
	testutil.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, err := range a.errs {
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), substr) {
				return nil
			}
		}
		return fmt.Errorf("no permissions violation for %s", substr)
	})
}

// badGrad is a gradient of the wrong length (8 bytes): stored, then rejected as bad_length.
func badGrad(id string, shard int, step int64) *nats.Msg {
	m := nats.NewMsg(wire.GradSubject(id, shard))
	m.Header.Set(wire.HdrStep, strconv.FormatInt(step, 10))
	m.Header.Set(wire.HdrRank, "0")
	m.Header.Set(wire.HdrDtype, wire.DtypeF32)
	m.Data = make([]byte, 8)
	return m
}

func initMsg(id string, shard int, data []byte) *nats.Msg {
	m := nats.NewMsg(wire.InitSubject(id, shard))
	m.Header.Set(wire.HdrStep, "0")
	m.Header.Set(wire.HdrDtype, wire.DtypeF32)
	m.Data = data
	return m
}

func awaitReject(t *testing.T, sub *nats.Subscription, reason wire.Reason) *wire.Reject {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			break
		}
		if rej, err := wire.UnmarshalReject(m.Data); err == nil && rej.Reason == reason {
			return rej
		}
	}
	t.Fatalf("no %s rejection", reason)
	return nil
}

func f32le(v []float32) []byte {
	b := make([]byte, 4*len(v))
	functions.EncodeLE(b, v)
	return b
}

func httpStatus(t *testing.T, url, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// metricSum sums a counter's series for a job on the Prometheus endpoint url.
func metricSum(t *testing.T, url, name, jobID string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	sum := 0.0
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, `fanin_job="`+jobID+`"`) {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		sum += v
	}
	return sum
}

// rssOf is a process's resident memory in bytes.
func rssOf(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// TestIsAnswer: what the attack suite's spy counts as an answer that crossed into fanin's account,
// and what it leaves as fanin's own traffic.
func TestIsAnswer(t *testing.T) {
	msg := func(data string, hdr ...string) *nats.Msg {
		m := nats.NewMsg("x")
		m.Data = []byte(data)
		for i := 0; i+1 < len(hdr); i += 2 {
			m.Header.Set(hdr[i], hdr[i+1])
		}
		return m
	}
	for _, c := range []struct {
		name string
		m    *nats.Msg
		want bool
	}{
		{"publish acknowledgement", msg(`{"stream":"FANIN_GRAD_mallory","seq":7}`), true},
		{"API error", msg(`{"type":"io.nats.jetstream.api.v1.stream_delete_response","error":{"code":403}}`), true},
		{"direct get", msg("\x00\x00", "Nats-Stream", "FANIN_PARAMS_mallory", "Nats-Subject", "fanin.v1.mallory.params.0"), true},
		{"direct get: no message", msg("", "Status", "404"), true},
		{"the attacker's record", msg(`{"spec":{"id":"mallory"}}`), true},
		{"a rejection report", msg(`{}`, wire.HdrReject, string(wire.ReasonBadLength)), true},
		{"a victim's placement", msg(`{"runtime":"fanin-runtime-7d9f","epoch":3}`), false},
		{"a victim's parameters", msg("\x01\x02\x03\x04", wire.HdrStep, "12", wire.HdrDtype, wire.DtypeF32), false},
	} {
		if got := isAnswer(c.m, "mallory"); got != c.want {
			t.Errorf("%s: isAnswer %v, want %v", c.name, got, c.want)
		}
	}
}
