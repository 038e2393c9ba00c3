package testutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// CheckFor polls f every step until it returns nil, failing the test with f's last error after wait.
func CheckFor(t testing.TB, wait, step time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(wait)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %v", wait, err)
		}
		time.Sleep(step)
	}
}

// FreePort returns a loopback TCP port that was free a moment ago, for programs that cannot report
// the port they bound. The port is outside the kernel's ephemeral range (pickPort says why).
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePorts(t, 1)[0]
}

// FreePorts returns n distinct free TCP ports on 127.0.0.1, outside the kernel's ephemeral range:
// each is held until all are picked, so none is handed out twice.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range n {
		ln, err := pickPort()
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// pickPort listens on a random free loopback port below the kernel's ephemeral range (Linux's
// net.ipv4.ip_local_port_range), falling back to one the kernel picks. A port picked for a server
// that starts later is free until then only if nothing else takes it, and the kernel hands
// ephemeral ports to every outgoing connection: a cluster's first nodes dialling the route port of
// one not started yet could be given its client port (or that very route port: a TCP connection
// to itself), and that node then failed to listen. Below the range, only an explicit bind takes a
// port.
func pickPort() (net.Listener, error) {
	lo, hi := 10000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if first, err := strconv.Atoi(f[0]); err == nil {
				hi = first
			}
		}
	}
	for i := 0; hi-lo >= 1000 && i < 50; i++ {
		if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", lo+rand.IntN(hi-lo))); err == nil {
			return ln, nil
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// NATS starts an embedded NATS server with JetStream, its store in a temporary directory, shut down
// when the test ends, and returns its URL.
func NATS(t testing.TB) string {
	t.Helper()
	ns, err := embed.Start(embed.Config{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	return ns.ClientURL()
}

// Connect connects to the NATS server at url with opts, closed when the test ends, and returns the
// connection and its JetStream context.
func Connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// Logger logs warnings and errors to stderr when FANIN_TEST_LOG is set, otherwise nothing.
func Logger() *slog.Logger {
	if os.Getenv("FANIN_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Stack starts an in-process fanin (embedded NATS on a free port, gateway, placer and runtimes)
// and stops it when the test ends.
func Stack(t testing.TB, runtimes int) *devstack.Stack {
	t.Helper()
	st, err := devstack.Start(context.Background(), devstack.Config{
		DataDir: t.TempDir(), NATSPort: -1, HTTPAddr: "127.0.0.1:0", Runtimes: runtimes, Logger: Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// Gradient fills g with a deterministic pseudo-gradient of rank at step that depends on the
// current parameters, as a real model's would: g[i] = 0.5*p[i] + 0.01*noise(step, rank, i).
// Driver and reference call it with the same parameters, so they see the same gradients.
func Gradient(g, params []float32, step int64, rank int) {
	for i := range g {
		z := uint64(step)*0x9E3779B97F4A7C15 ^ uint64(rank)*0xBF58476D1CE4E5B9 ^ uint64(i)*0x94D049BB133111EB
		z = (z ^ (z >> 31)) * 0xD6E8FEB86659FD93
		z ^= z >> 32
		noise := float32(int32(uint32(z))) / float32(math.MaxInt32)
		g[i] = float32(0.5*params[i]) + float32(0.01*noise)
	}
}

// TrainUntilStopped steps every rank of rec (deterministic gradients, pause between steps), each
// on its own connection to url, until stop is called; stop returns once they have all stopped.
func TrainUntilStopped(t testing.TB, url string, rec *job.Record, pause time.Duration) (stop func()) {
	t.Helper()
	return TrainUntilStoppedWith(t, url, rec, pause)
}

// TrainUntilStoppedWith is TrainUntilStopped with connections made with opts.
func TrainUntilStoppedWith(t testing.TB, url string, rec *job.Record, pause time.Duration, opts ...sdk.Option) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, rec.Spec.Ranks)
	var workers []*sdk.Worker
	for r := range rec.Spec.Ranks {
		c, err := sdk.Connect(ctx, url, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		w, err := c.Worker(ctx, rec.Spec.ID, r)
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
	}
	for r, w := range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			_, params, err := w.Params(ctx)
			if err != nil {
				return
			}
			g := make([]float32, len(params))
			for step := int64(1); ctx.Err() == nil; step++ {
				Gradient(g, params, step, r)
				if params, err = w.Step(ctx, g); err != nil {
					return
				}
				time.Sleep(pause)
			}
		}()
	}
	return func() {
		cancel()
		for range workers {
			<-done
		}
		for _, w := range workers {
			_ = w.Close()
		}
	}
}

// Train runs steps BSP steps of rec with one SDK worker per rank (deterministic gradients), each on
// its own connection to url made with opts, and fails the test on any worker's error.
func Train(t testing.TB, url string, rec *job.Record, steps int, opts ...sdk.Option) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, rec.Spec.Ranks)
	for r := range rec.Spec.Ranks {
		c, err := sdk.Connect(ctx, url, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		w, err := c.Worker(ctx, rec.Spec.ID, r)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, params, err := w.Params(ctx)
			if err != nil {
				errs <- err
				return
			}
			g := make([]float32, len(params))
			for step := int64(1); step <= int64(steps); step++ {
				Gradient(g, params, step, r)
				if params, err = w.Step(ctx, g); err != nil {
					errs <- fmt.Errorf("rank %d, step %d: %w", r, step, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// ParamsAt waits until every shard's newest parameters in the job's parameter stream ps are those
// of step, and returns them as one vector, decoded by their Fanin-Dtype (wire.DecodeParams): for
// a job with param_dtype bf16, the workers' rounded copy after step 0.
func ParamsAt(t testing.TB, ps LastMsgGetter, rec *job.Record, step int64) []float32 {
	t.Helper()
	out := make([]float32, rec.Layout.Elements)
	for _, s := range rec.Layout.Shards {
		CheckFor(t, 20*time.Second, 2*time.Millisecond, func() error {
			m, err := ps.GetLastMsgForSubject(context.Background(), wire.ParamsSubject(rec.Spec.ID, s.ID))
			if err != nil {
				return err
			}
			got, err := wire.ParseStep(m.Header)
			if err != nil {
				return err
			}
			if got != step {
				return fmt.Errorf("shard %d at step %d, want %d", s.ID, got, step)
			}
			_, err = wire.DecodeParams(out[s.Off:s.Off+s.Len], m.Header, m.Data)
			return err
		})
	}
	return out
}

// ParamsPayload is what a parameters message of shard s at step must hold when the service's f32
// master parameters of the whole model are master: its dtype, and its payload, master's bytes at
// step 0 and for an f32 job, otherwise master rounded to the job's param_dtype (wire.Encode
// rounds to nearest even, as wire.Round does).
func ParamsPayload(rec *job.Record, s job.Shard, step int64, master []float32) (wire.Dtype, []byte) {
	dt := rec.Spec.ParamsDtype()
	if step == 0 {
		dt = wire.F32
	}
	b := make([]byte, s.Len*dt.ElemSize())
	wire.Encode(b, master[s.Off:s.Off+s.Len], dt)
	return dt, b
}

// LastMsgGetter reads the newest message of a subject: a jetstream.Stream, or DirectGetter for a
// job's credentials, which may make no other JetStream request.
type LastMsgGetter interface {
	GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error)
}

// DirectGetter reads the newest message of a subject of stream by a direct get over nc.
func DirectGetter(nc *nats.Conn, stream string) LastMsgGetter { return directGetter{nc, stream} }

type directGetter struct {
	nc     *nats.Conn
	stream string
}

func (d directGetter) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	m, err := d.nc.RequestWithContext(ctx, wire.DirectGetLast(d.stream, subject), nil)
	if err != nil {
		return nil, err
	}
	if st := m.Header.Get("Status"); st != "" {
		return nil, fmt.Errorf("direct get %s: status %s %s", subject, st, m.Header.Get("Description"))
	}
	return &jetstream.RawStreamMsg{Subject: subject, Header: m.Header, Data: m.Data}, nil
}

// ConnectOnce connects to url as a worker of job id with its credentials (jwt, seed, inbox prefix)
// would, without any retry, subscribes to the job's parameters and reads its record, each once.
// It returns the open connection, for more checks of the caller's; the caller closes it.
func ConnectOnce(url, id, jwt, seed, inboxPrefix string) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.UserJWTAndSeed(jwt, seed), nats.CustomInboxPrefix(inboxPrefix),
		nats.Timeout(2*time.Second), nats.NoReconnect())
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if _, err := nc.SubscribeSync(wire.ParamsWildcard(id)); err != nil {
		nc.Close()
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	if err := nc.Flush(); err != nil {
		nc.Close()
		return nil, fmt.Errorf("flush: %w", err)
	}
	if _, err := nc.Request(wire.JobRecordGet(id), nil, 2*time.Second); err != nil {
		nc.Close()
		return nil, fmt.Errorf("read the job's record: %w", err)
	}
	return nc, nil
}

// PublishGrad publishes a gradient message as a worker does when its job's stream is full: the
// stream refuses it ("maximum messages exceeded", DiscardNew) until the runtimes purge the steps
// they applied, which a loaded machine delays; the publish is retried until then (up to 30 s), and
// any other error fails the test.
func PublishGrad(t testing.TB, ctx context.Context, js jetstream.JetStream, m *nats.Msg) *jetstream.PubAck {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ack, err := js.PublishMsg(ctx, m)
		var apiErr *jetstream.APIError
		full := errors.As(err, &apiErr) && (strings.Contains(apiErr.Description, "maximum messages exceeded") ||
			strings.Contains(apiErr.Description, "maximum bytes exceeded"))
		if err == nil || !full || time.Now().After(deadline) {
			if err != nil {
				t.Fatal(err)
			}
			return ack
		}
		time.Sleep(20 * time.Millisecond) // the runtimes purge asynchronously
	}
}
