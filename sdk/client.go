package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
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
	tracing *telemetry.Provider // nil: tracing off
	met     *workerMetrics      // nil: metrics off (WithMetrics)
}

// Option configures a Client.
type Option func(*Client) error

// WithNATSOptions passes options (credentials, TLS, names) to nats.Connect in Connect.
func WithNATSOptions(opts ...nats.Option) Option {
	return func(c *Client) error { c.natsOpt = append(c.natsOpt, opts...); return nil }
}

// Connect dials the NATS server at url. Options: WithNATSOptions, WithJobCredentials,
// WithCredentialsFile, WithTracerProvider, WithTracing, WithMetrics.
func Connect(ctx context.Context, url string, opts ...Option) (*Client, error) {
	c := &Client{ownConn: true, tracing: telemetry.Default()}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	nopts := append([]nats.Option{nats.Name("fanin-sdk")}, c.natsOpt...)
	nc, err := nats.Connect(url, nopts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	if err := c.init(nc); err != nil {
		nc.Close()
		return nil, err
	}
	return c, ctx.Err()
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

// Job reads a job's record (spec and shard layout) from the jobs bucket.
func (c *Client) Job(ctx context.Context, id string) (*job.Record, error) {
	kv, err := c.js.KeyValue(ctx, wire.JobsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("job %q: %w", id, ErrUnknownJob)
	}
	if err != nil {
		return nil, fmt.Errorf("open jobs bucket: %w", err)
	}
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		return nil, fmt.Errorf("job %q: %w", id, ErrUnknownJob)
	}
	if err != nil {
		return nil, fmt.Errorf("read job %q: %w", id, err)
	}
	var rec job.Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, fmt.Errorf("decode job %q: %w", id, err)
	}
	return &rec, nil
}

// UploadParams publishes a job's initial (step 0) parameters; for jobs created with init "upload".
// Re-uploading the same step is de-duplicated.
func (c *Client) UploadParams(ctx context.Context, id string, params []float32) error {
	rec, err := c.Job(ctx, id)
	if err != nil {
		return err
	}
	if len(params) != rec.Layout.Elements {
		return fmt.Errorf("upload to job %q: %d parameters, the job has %d", id, len(params), rec.Layout.Elements)
	}
	for _, s := range rec.Layout.Shards {
		m := nats.NewMsg(wire.ParamsSubject(id, s.ID))
		m.Header.Set(wire.HdrStep, "0")
		m.Header.Set(wire.HdrSeq, "0")
		m.Header.Set(wire.HdrDtype, wire.DtypeF32)
		m.Header.Set(wire.HdrMsgID, wire.ParamsMsgID(id, s.ID, 0))
		m.Data = make([]byte, s.Bytes())
		functions.EncodeLE(m.Data, params[s.Off:s.Off+s.Len])
		if _, err := c.js.PublishMsg(ctx, m); err != nil {
			return fmt.Errorf("upload shard %d of job %q: %w", s.ID, id, err)
		}
	}
	return nil
}

// ackTimeout bounds the wait for JetStream to acknowledge an asynchronous publish.
const ackTimeout = 30 * time.Second
