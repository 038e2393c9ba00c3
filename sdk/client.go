package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/natsreq"
	"github.com/fanin-ml/fanin/internal/telemetry"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// ErrUnknownJob is returned when no job has the given id (matches wire.ErrReason(wire.ReasonUnknownJob)).
var ErrUnknownJob = wire.ErrReason(wire.ReasonUnknownJob)

// Client is a connection to fanin's data plane. It is safe for concurrent use; each Worker it makes
// is not.
type Client struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	ownConn bool
	natsOpt []nats.Option
	credJob string              // the job the connection's credentials are for; "" when not a job's
	tracing *telemetry.Provider // nil: tracing off
	meter   Meter               // nil: metrics off (WithMeter)
}

// Option configures a Client.
type Option func(*Client) error

// WithNATSOptions passes options (credentials, TLS, names) to nats.Connect in Connect.
func WithNATSOptions(opts ...nats.Option) Option {
	return func(c *Client) error { c.natsOpt = append(c.natsOpt, opts...); return nil }
}

// Connect dials the NATS server at url. Options: WithNATSOptions, WithJobCredentials,
// WithCredentialsFile, WithTracerProvider, WithTracing, WithMeter (prom.WithMetrics).
func Connect(ctx context.Context, url string, opts ...Option) (*Client, error) {
	c := &Client{ownConn: true, tracing: telemetry.Default()}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// ctx bounds the dial (and cancels it); the connection then lives until Close.
	nopts := append([]nats.Option{nats.Name("fanin-sdk"), nats.SetCustomDialer(ctxDialer{ctx})}, c.natsOpt...)
	nc, err := nats.Connect(url, nopts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	if err := c.init(nc); err != nil {
		nc.Close()
		return nil, err
	}
	if err := ctx.Err(); err != nil { // never a live client with an error
		nc.Close()
		return nil, err
	}
	return c, nil
}

// ctxDialer dials with the Connect call's context while it lasts: a cancelled Connect stops
// dialing. Reconnects, after Connect has returned, dial without it.
type ctxDialer struct{ ctx context.Context }

func (d ctxDialer) Dial(network, address string) (net.Conn, error) {
	ctx := d.ctx
	if ctx.Err() != nil {
		ctx = context.Background()
	}
	var dialer net.Dialer
	if _, ok := ctx.Deadline(); !ok {
		dialer.Timeout = 2 * time.Second // nats.go's default connect timeout
	}
	return dialer.DialContext(ctx, network, address)
}

// New uses an existing connection, which the caller keeps and closes. Options as for Connect.
func New(nc *nats.Conn, opts ...Option) (*Client, error) {
	c := &Client{tracing: telemetry.Default()}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	return c, c.init(nc)
}

func (c *Client) init(nc *nats.Conn) error {
	// Without a timeout, an acknowledgement lost in a reconnect would leave its future (and the
	// buffer it holds) waiting forever; a timeout turns it into a retry, which the message id
	// makes safe.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(ackTimeout))
	if err != nil {
		return err
	}
	c.nc, c.js = nc, js
	return nil
}

// Conn is the underlying NATS connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Close closes the connection if Connect opened it.
func (c *Client) Close() {
	if c.ownConn {
		c.nc.Close()
	}
}

// Job reads a job's record (spec and shard layout) from the jobs bucket, by a direct get: the
// only request a job's credentials may make of the bucket.
func (c *Client) Job(ctx context.Context, id string) (*job.Record, error) {
	if !validJobID(id) {
		return nil, fmt.Errorf("job %q: %w", id, ErrUnknownJob)
	}
	if c.credJob != "" && id != c.credJob {
		// NATS would refuse the read as a permissions violation, which a request only sees as
		// its timeout: say why at once.
		return nil, fmt.Errorf("job %q: %w", id, wire.Rejectf(wire.ReasonForbidden, "these are job %q's credentials: they reach no other job", c.credJob))
	}
	m, err := c.directGet(ctx, wire.JobRecordGet(id), nil)
	if errors.Is(err, errNoMessage) {
		return nil, fmt.Errorf("job %q: %w", id, ErrUnknownJob)
	}
	if errors.Is(err, nats.ErrNoResponders) { // the bucket is being elected a leader, or missing
		return nil, fmt.Errorf("read job %q: the jobs bucket does not answer (no responders): %w", id, err)
	}
	if err != nil {
		return nil, fmt.Errorf("read job %q: %w", id, err)
	}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return nil, fmt.Errorf("job %q: %w", id, ErrUnknownJob)
	}
	var rec job.Record
	if err := json.Unmarshal(m.Data, &rec); err != nil {
		return nil, fmt.Errorf("decode job %q: %w", id, err)
	}
	return &rec, nil
}

// validJobID reports whether id can name a job (job.Spec's id rule): anything else would not even
// make a valid subject.
func validJobID(id string) bool {
	if id == "" || len(id) > 63 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' && i > 0) {
			return false
		}
	}
	return true
}

// errNoMessage is a direct get's answer when the subject holds no message.
var errNoMessage = errors.New("no message")

// noRespondersPatience bounds how long a direct get retries "no responders" (directGet).
const noRespondersPatience = 5 * time.Second

// directGet asks JetStream for a stored message with a direct get (subject: wire.DirectGetLast or
// wire.DirectGet with a JSON body). A job's account may make no other JetStream request.
//
// Each attempt has its own deadline (natsreq.Attempt), whatever ctx's: a reply lost in a failover
// is asked for again instead of waited for forever (a worker's Step context has no deadline).
// "No responders" is retried, with a backoff, for up to noRespondersPatience: it is what a stream
// answers while it elects a leader, and what a job account answers in the first milliseconds after
// its first connections (nats-server, registering an account that two connections looked up at
// once, drops and re-adds its imports).
func (c *Client) directGet(ctx context.Context, subject string, body []byte) (*nats.Msg, error) {
	m, err := natsreq.Request(ctx, c.nc, subject, body, natsreq.WithNoResponders(noRespondersPatience))
	if err != nil {
		return nil, err
	}
	switch status := m.Header.Get("Status"); status {
	case "":
		return m, nil
	case "404":
		return nil, errNoMessage
	default:
		return nil, fmt.Errorf("direct get %s: status %s %s", subject, status, m.Header.Get("Description"))
	}
}

// UploadParams uploads a job's initial (step 0) parameters, for jobs created with init "upload".
// Each shard's upload is stored once: the runtime that serves the shard checks it and publishes it
// as the step-0 parameters (Worker.Params waits for them); a refused upload (say, NaN in a job
// that forbids it) is reported on the job's rejects subject and may be sent again. Uploading the
// same parameters again within the de-duplication window (2 minutes) is a no-op; once a shard's
// upload is stored, another is refused.
func (c *Client) UploadParams(ctx context.Context, id string, params []float32) error {
	rec, err := c.Job(ctx, id)
	if err != nil {
		return err
	}
	if rec.Spec.Init.Kind != "upload" {
		return fmt.Errorf("upload to job %q: its init is %q, not upload", id, rec.Spec.Init.Kind)
	}
	if len(params) != rec.Layout.Elements {
		return fmt.Errorf("upload to job %q: %d parameters, the job has %d", id, len(params), rec.Layout.Elements)
	}
	for _, s := range rec.Layout.Shards {
		m := wire.InitMsg(id, s.ID, make([]byte, s.Bytes()))
		wire.Encode(m.Data, params[s.Off:s.Off+s.Len], wire.F32)
		if _, err := c.js.PublishMsg(ctx, m); err != nil {
			if strings.Contains(err.Error(), "maximum messages per subject exceeded") {
				return fmt.Errorf("upload shard %d of job %q: %w", s.ID, id, ErrUploaded)
			}
			return fmt.Errorf("upload shard %d of job %q: %w", s.ID, id, err)
		}
	}
	return nil
}

// ErrUploaded is UploadParams' error when the job's initial parameters were stored already, by an
// earlier upload (outside the de-duplication window, or of other values).
var ErrUploaded = errors.New("the job's initial parameters are uploaded already (they are written once)")

// ackTimeout bounds the wait for JetStream to acknowledge an asynchronous publish. A publish that
// reached a stream leader as it died is never answered: after ackTimeout it is sent again under the
// same message id (Worker.publishRetrying), which JetStream drops should the first have landed. A
// healthy acknowledgement takes milliseconds, a large one under load well under a second; 30 s here
// once stalled training for 30 s after a node loss.
const ackTimeout = 3 * time.Second

// pubAttempt bounds a synchronous retry of a publish. Each retry that follows one without an
// acknowledgement in its time (the asynchronous publish's ackTimeout, or the retry before) has twice
// the time of the one before, up to pubAttemptMax, so that an acknowledgement slower than
// pubAttempt (a gradient crossing a full link to its stream's server) comes in the end instead of
// every retry being cut short and its bytes sent again on top of the last. pubBackoff is the
// longest wait between two retries. A retry sent during an election is not answered either, so the
// first retry after it ends comes at most pubAttemptMax+pubBackoff later.
const (
	pubAttempt    = 2 * time.Second
	pubAttemptMax = 8 * time.Second
	pubBackoff    = 250 * time.Millisecond
)
