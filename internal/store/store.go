// Package store creates and opens the JetStream state that fanin's components share: the key-value
// buckets of jobs, placement and runtimes, and each job's streams.
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// Buckets are the shared key-value buckets.
type Buckets struct {
	Jobs      jetstream.KeyValue
	Placement jetstream.KeyValue
	Runtimes  jetstream.KeyValue
	Handover  jetstream.KeyValue
	Leader    jetstream.KeyValue
	Policy    jetstream.KeyValue
	Assign    jetstream.KeyValue // key <job>: which elastic worker holds which ranks (wire.Assignment)
}

// LeaderTTL is how long the autoscaler's leader lock lives without renewal: how long the
// autoscalers go without a leader when theirs dies, and how long a renewal may take behind a full
// link before the leader steps down (2 s and more at 25 Mbit/s).
const LeaderTTL = 10 * time.Second

// PlacementHistory is how many revisions of each shard's placement the placement bucket keeps.
const PlacementHistory = 8

// RuntimeTTL is how long a runtime's registration lives without a heartbeat.
const RuntimeTTL = 10 * time.Second

// RuntimeHeartbeat is how often a runtime renews its registration.
const RuntimeHeartbeat = time.Second

// RuntimeLapse is the one liveness rule of every component: a runtime whose last heartbeat is older
// than its lapse is dead (the autoscaler places its shards elsewhere, the gateway and the dashboard
// show it dead, a runtime waiting for its release takes its shard). RuntimeLapse is the shortest
// lapse, the one a runtime gets unless it asks for more: several heartbeats, so that one delayed
// by a stream leader's election kills nobody.
const RuntimeLapse = 5 * RuntimeHeartbeat

// MaxRuntimeLapse is the longest lapse a runtime may ask for: the registry's TTL, after which its
// entry is gone anyway.
const MaxRuntimeLapse = RuntimeTTL

// LapseFor is the lapse a runtime asks for when its heartbeats took up to rtt to be acknowledged
// lately. A judge that reads the registry learns of a heartbeat up to the heartbeat's delay to the
// registry's leader, plus the judge's own delay from that leader, after it was sent; both ride the
// same NATS routes as the data, which a full link can hold up for seconds. Two round trips and a
// heartbeat period cover both, so that a runtime whose heartbeats are late is not taken for dead
// while one whose heartbeats stopped still is, within MaxRuntimeLapse (and the autoscaler's
// allowance for its own view's lag, when no runtime at all is heard).
func LapseFor(rtt time.Duration) time.Duration {
	return Lapse(RuntimeHeartbeat + 2*rtt)
}

// Lapse is the lapse a runtime that asked for declared gets: RuntimeLapse at least (a registration
// that asks for nothing, from a runtime older than the field), MaxRuntimeLapse at most.
func Lapse(declared time.Duration) time.Duration {
	return min(MaxRuntimeLapse, max(RuntimeLapse, declared))
}

// RuntimeAlive applies the liveness rule to a runtime last heard of at beat that asked for lapse
// (wire.RuntimeInfo.Lapse; zero for the default).
func RuntimeAlive(beat time.Time, lapse time.Duration, now time.Time) bool {
	return now.Sub(beat) < Lapse(lapse)
}

// OpenBuckets creates the buckets if they do not exist and opens them. Every component calls it at
// start, so none depends on another having run first. Every bucket is file storage with
// StateReplicas replicas: losing any of them would need a human (the runtime registry too: a
// registry lost with a NATS restart left the autoscaler seeing no capacity).
func OpenBuckets(ctx context.Context, js jetstream.JetStream) (*Buckets, error) {
	r := StateReplicas(js.Conn())
	var b Buckets
	for _, o := range []struct {
		kv  *jetstream.KeyValue
		cfg jetstream.KeyValueConfig
	}{
		{&b.Jobs, jetstream.KeyValueConfig{Bucket: wire.JobsBucket, Description: "fanin job records", History: 1}},
		// A few revisions of history: a watcher that falls behind still sees every move of a
		// shard (with one, it would see only the newest), and a runtime can look up the entry
		// that placed a shard on it (runtime.releaseUnserved).
		{&b.Placement, jetstream.KeyValueConfig{Bucket: wire.PlacementBucket, Description: "fanin shard placement", History: PlacementHistory}},
		{&b.Runtimes, jetstream.KeyValueConfig{Bucket: wire.RuntimesBucket, Description: "fanin runtime registry", History: 1, TTL: RuntimeTTL}},
		{&b.Handover, jetstream.KeyValueConfig{Bucket: wire.HandoverBucket, Description: "fanin shard releases on migration", History: 1}},
		{&b.Leader, jetstream.KeyValueConfig{Bucket: wire.LeaderBucket, Description: "fanin autoscaler leader lock", History: 1, TTL: LeaderTTL}},
		{&b.Policy, jetstream.KeyValueConfig{Bucket: wire.PolicyBucket, Description: "fanin autoscaler policy and its history", History: 64}},
		{&b.Assign, jetstream.KeyValueConfig{Bucket: wire.AssignBucket, Description: "fanin elastic workers' rank assignment", History: 1}},
	} {
		o.cfg.Storage, o.cfg.Replicas = jetstream.FileStorage, r
		kv, err := EnsureKV(ctx, js, o.cfg)
		if err != nil {
			return nil, err
		}
		*o.kv = kv
	}
	return &b, nil
}

// StateReplicas is how many replicas fanin's own streams and buckets get on the deployment nc is
// connected to: 1 on a single server; in a cluster, its size (the servers nc knows of, which a
// cluster advertises to its clients) up to 3.
func StateReplicas(nc *nats.Conn) int {
	if nc == nil || nc.ConnectedClusterName() == "" {
		return 1
	}
	known := map[string]bool{}
	for _, u := range nc.Servers() {
		known[u] = true
	}
	return min(3, max(1, len(known)))
}

// EnsureKV opens a bucket of fanin's, creating it with cfg if it does not exist, and brings an
// existing one up to cfg's history and replicas (a bucket made by an older fanin, or on a server
// that has since become a cluster). A bucket whose storage differs from cfg's is recreated only if
// it holds nothing that outlives its TTL (the runtime registry); otherwise that is an error.
// While NATS is not ready (restarting, electing leaders) it waits, until ctx ends.
func EnsureKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (kv jetstream.KeyValue, err error) {
	err = untilUp(ctx, "bucket "+cfg.Bucket, func() (err error) {
		kv, err = ensureKV(ctx, js, cfg)
		return err
	})
	return kv, err
}

func ensureKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Another component won the race; on a cluster its stream may not answer yet.
			if kv, err = js.KeyValue(ctx, cfg.Bucket); vanished(err) {
				return nil, notYet{fmt.Errorf("open bucket %s: %w", cfg.Bucket, err)}
			}
		}
		if waitAtStart(err) {
			return nil, notYet{fmt.Errorf("create bucket %s: %w", cfg.Bucket, err)}
		}
		if err != nil {
			return nil, Unplaceable("bucket "+cfg.Bucket, cfg.Replicas, err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", cfg.Bucket, err)
	}
	if afterOpen != nil {
		afterOpen(cfg.Bucket)
	}
	st, err := kv.Status(ctx)
	if vanished(err) {
		// Found or created a moment ago, gone now: a fresh cluster's stream not answering yet
		// from every server, or a bucket deleted in between. Again from the start: it is created
		// if it is really missing.
		return nil, notYet{fmt.Errorf("open bucket %s: %w", cfg.Bucket, err)}
	}
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", cfg.Bucket, err)
	}
	info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
	if info.Config.Storage != cfg.Storage {
		if cfg.TTL == 0 {
			return nil, fmt.Errorf("bucket %s is %s storage, fanin needs %s: move its data by hand (nats stream backup, delete, restore)", cfg.Bucket, strings.ToLower(info.Config.Storage.String()), strings.ToLower(cfg.Storage.String()))
		}
		// Its entries expire within the TTL anyway, and their owners write them again.
		if err := js.DeleteKeyValue(ctx, cfg.Bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("recreate bucket %s as %s storage: %w", cfg.Bucket, cfg.Storage, err)
		}
		return EnsureKV(ctx, js, cfg)
	}
	if st.History() < int64(cfg.History) || info.Config.Replicas < cfg.Replicas || cfg.TTL > info.Config.MaxAge && info.Config.MaxAge != 0 {
		cfg.History = max(cfg.History, uint8(st.History()))
		cfg.Replicas = max(cfg.Replicas, info.Config.Replicas)
		if info.Config.MaxAge == 0 {
			cfg.TTL = 0 // none, kept: a TTL is raised, never lowered
		} else {
			cfg.TTL = max(cfg.TTL, info.Config.MaxAge)
		}
		if kv, err = js.UpdateKeyValue(ctx, cfg); err != nil {
			return nil, Unplaceable(fmt.Sprintf("bucket %s (raising it to history %d, TTL %v)", cfg.Bucket, cfg.History, cfg.TTL), cfg.Replicas, err)
		}
	}
	return kv, nil
}

// EnsureStream creates or updates one of fanin's own streams with cfg (its replicas at least
// StateReplicas, never fewer than it has), waiting while NATS is not ready, until ctx ends.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	cfg.Replicas = max(cfg.Replicas, StateReplicas(js.Conn()))
	var st jetstream.Stream
	err := untilUp(ctx, "stream "+cfg.Name, func() error {
		want := cfg
		if cur, err := js.Stream(ctx, cfg.Name); err == nil {
			want.Replicas = max(want.Replicas, cur.CachedInfo().Config.Replicas)
		}
		var err error
		if st, err = js.CreateOrUpdateStream(ctx, want); vanished(err) || waitAtStart(err) {
			return notYet{fmt.Errorf("stream %s: %w", cfg.Name, err)} // deleted in between, or see waitAtStart: again
		} else if err != nil {
			return Unplaceable("stream "+cfg.Name, want.Replicas, err)
		}
		return nil
	})
	return st, err
}

// EnsureSizedStream is EnsureStream for a stream of fanin's own whose MaxBytes is a wish, not a
// need (a log of recent events): when the servers cannot reserve cfg.MaxBytes, it halves it until
// they can or it would fall below floor. It returns the stream and the bytes reserved; a NATS
// server on a small disk (its JetStream max_store is 75% of the free space by default) then still
// runs fanin, with a shorter log.
func EnsureSizedStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, floor int64) (jetstream.Stream, int64, error) {
	for {
		st, err := EnsureStream(ctx, js, cfg)
		if err == nil || !StorageFull(err) || cfg.MaxBytes/2 < floor {
			return st, cfg.MaxBytes, err
		}
		cfg.MaxBytes /= 2
	}
}

// ErrStorageFull says that the NATS servers are out of the storage they may use for JetStream: a
// stream's reservation (MaxBytes) or a message did not fit.
var ErrStorageFull = errors.New("the NATS servers are out of JetStream storage")

// StorageFull tells the errors of a NATS server out of JetStream storage: a reservation it cannot
// make (max_store or max_memory reached by the streams' reservations) or a write that the disk
// refused.
func StorageFull(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, ErrStorageFull) || (errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == errStorageResourcesExceeded || apiErr.ErrorCode == errMemoryResourcesExceeded)) ||
		(err != nil && strings.Contains(err.Error(), "no space left on device"))
}

// JetStream's error codes for a reservation beyond max_store or max_memory (nats-server's
// JSStorageResourcesExceededErr and JSMemoryResourcesExceededErr).
const (
	errStorageResourcesExceeded jetstream.ErrorCode = 10047
	errMemoryResourcesExceeded  jetstream.ErrorCode = 10028
)

// Transient tells the JetStream errors that pass by themselves: a request met a server restarting,
// a cluster forming, or a stream or meta leader being elected (nothing answers in the meantime).
func Transient(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == errClusterNotAvailable)
}

// errClusterNotAvailable is JetStream's "JetStream system temporarily unavailable" (a cluster
// without a meta leader yet: nats-server's JSClusterNotAvailErr).
const errClusterNotAvailable jetstream.ErrorCode = 10008

// storeRace tells a stream creation that a server of the cluster refused because it could not
// create the stream's store: JetStream's "error creating store for stream" (a member's store
// failure, as the meta leader reports it). On a fresh cluster a server enabling JetStream for an
// account removes the account's directory when it holds no streams yet (nats-server checks that it
// can write there), and a stream being created in it at that moment fails with "could not create
// storage directory ... no such file or directory": a component then exited at start and was
// restarted (TestKubeNode, one run in six). The meta leader drops the failed assignment, so the
// creation may simply be made again; a store that can never be created (a read-only disk, say)
// is retried with a warning that says so, like any NATS that is not ready.
//
// While that happens, a creation request can also be answered with neither the stream nor an
// error (jetstream.ErrInvalidJetStreamResponse: seen in about 1 of 5 runs of
// TestBucketStoreFailureWaitedFor); creating again is as safe.
func storeRace(err error) bool {
	if errors.Is(err, jetstream.ErrInvalidJetStreamResponse) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errStreamCreate &&
		(strings.Contains(apiErr.Description, "error creating store") || strings.Contains(apiErr.Description, "could not create storage directory"))
}

// waitAtStart tells the errors creating one of fanin's buckets or streams that a component at
// start waits for (untilUp), as a cluster forming gives them: storeRace and peersUnknown.
func waitAtStart(err error) bool { return storeRace(err) || peersUnknown(err) }

// peersUnknown tells JetStream's "no suitable peers for placement" (nats-server's
// JSClusterNoPeersErr): the cluster's leader knows of too few servers able to hold the replicas
// asked. The replicas asked are min(3, the servers the cluster has: StateReplicas), so this is a
// cluster forming, whose leader has not heard every server's JetStream statistics yet (seen as the
// race detector slowed a 3-server test cluster's start), or servers down or out of resources:
// either way, waiting and saying so (untilUp) is what a component at start can do.
func peersUnknown(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errClusterNoPeers
}

const errClusterNoPeers jetstream.ErrorCode = 10005

// errStreamCreate is JetStream's generic stream creation error (nats-server's JSStreamCreateErrF),
// which carries a member's store failure in a cluster.
const errStreamCreate jetstream.ErrorCode = 10049

// notYet marks a start-up error that passes by itself: a bucket or stream that was found or
// created a moment ago and is not found now (untilUp retries it).
type notYet struct{ err error }

func (e notYet) Error() string { return e.err.Error() }
func (e notYet) Unwrap() error { return e.err }

// vanished tells a bucket's or stream's "not found".
func vanished(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound)
}

// afterOpen, when set (tests), runs between opening a bucket and reading its status: a fault point
// for a bucket that vanishes in between.
var afterOpen func(bucket string)

// untilUp runs fn, again after a backoff (100 ms doubling to 2 s) while it fails with a transient
// error or one that is notYet, until ctx ends: a component that starts while NATS restarts, a
// cluster elects its leaders or its buckets are being created waits for it, saying so, instead of
// exiting. It also waits, for up to jetStreamOffWait, while JetStream is not enabled for the
// account (jetStreamOff).
func untilUp(ctx context.Context, what string, fn func() error) error {
	return untilUpFor(ctx, what, jetStreamOffWait, fn)
}

// untilUpFor is untilUp waiting up to offWait while JetStream is not enabled for the account.
func untilUpFor(ctx context.Context, what string, offWait time.Duration, fn func() error) error {
	backoff := 100 * time.Millisecond
	var offSince time.Time
	for {
		err := fn()
		off := jetStreamOff(err)
		if off {
			if offSince.IsZero() {
				offSince = time.Now()
			}
			if time.Since(offSince) >= offWait {
				return fmt.Errorf("%w: JetStream is not enabled on the NATS server for this connection's account (still so after %v): enable it there (`jetstream` in the server's configuration, and in the account's)", err, offWait)
			}
		}
		if err == nil || !(Transient(err) || errors.As(err, new(notYet)) || off) || ctx.Err() != nil {
			return err
		}
		slog.Warn("NATS is not ready; retrying", "what", what, "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// jetStreamOffWait is how long a component at start waits while NATS answers that JetStream is not
// enabled for its account. A server of a cluster that just formed answers so until it has enabled
// JetStream for the account (a gateway exited at start on it, and was restarted by Kubernetes:
// TestKubeNode); a server without JetStream for the account keeps answering so, and is then
// reported as such.
const jetStreamOffWait = 30 * time.Second

// jetStreamOff tells JetStream's "not enabled" and "not enabled for account" answers.
func jetStreamOff(err error) bool {
	return errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) || errors.Is(err, jetstream.ErrJetStreamNotEnabled)
}

// JetStream's error codes for a replica count the server cannot honour (nats-server's
// JSStreamReplicasNotSupportedErr and JSInsufficientResourcesErr); nats.go names neither.
const (
	errReplicasNotSupported  jetstream.ErrorCode = 10074
	errInsufficientResources jetstream.ErrorCode = 10023
)

// Unplaceable explains an error creating what with replicas replicas, saying so plainly when the
// server cannot honour the replica count (not clustered, or too few servers up); other errors pass
// through with what named.
func Unplaceable(what string, replicas int, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case errReplicasNotSupported:
			return fmt.Errorf("%s: %d replicas asked but the NATS server is not clustered: %w", what, replicas, err)
		case errInsufficientResources:
			return fmt.Errorf("%s: the NATS cluster cannot place %d replicas (fewer servers up, or out of storage); fanin keeps its state on min(3, cluster size) servers: bring them back or add storage: %w", what, replicas, err)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// CheckpointBytes is the size of one shard checkpoint of a job: parameters and optimizer state.
func CheckpointBytes(rec *job.Record, shard job.Shard) (int, error) {
	slots, err := rec.Spec.FuncSlots()
	if err != nil {
		return 0, err
	}
	return (1 + slots) * shard.Bytes(), nil
}

// CheckFits reports a specific error when the job's messages would exceed the server's max_payload.
func CheckFits(rec *job.Record, maxPayload int64) error {
	slots, err := rec.Spec.FuncSlots()
	if err != nil {
		return err
	}
	largest := 0
	for _, s := range rec.Layout.Shards {
		largest = max(largest, s.Bytes())
	}
	need := int64((1+slots)*largest) + wire.Headroom
	if need > maxPayload {
		return fmt.Errorf("%w: shard_size: a shard checkpoint of %s (%d vector(s) of %s) plus headers needs max_payload >= %d bytes, the NATS server allows %d: use a smaller shard_size or raise max_payload",
			job.ErrInvalidSpec, job.ByteSize((1+slots)*largest), 1+slots, job.ByteSize(largest), need, maxPayload)
	}
	return nil
}

// FirstSeq is the first sequence of the streams of the job incarnation rec: the microseconds of
// its creation time since the Unix epoch. A job deleted and created again under the same id gets
// streams of the same names, and a runtime still draining the deleted incarnation purges and
// deletes by sequence: it checks that the stream is still the one it opened, but the job can be
// created again between the check and the request, and a bound or sequence of the old stream would
// then take the new incarnation's gradients (and stall it at its first step). Starting each
// incarnation's sequences at its creation time keeps them disjoint: an incarnation stores fewer
// messages than the microseconds it lives (its stream's bound refuses beyond a few per shard and
// step), so its last sequence stays below the next incarnation's first, as long as the gateways'
// clocks do not step back by more than its life. A record without a creation time starts at 1.
func FirstSeq(rec *job.Record) uint64 {
	if us := rec.Created.UnixMicro(); us > 0 {
		return uint64(us)
	}
	return 0
}

// CreateJobStreams creates the streams of a job: its gradients, its parameters and checkpoints,
// and for init "upload" its initial parameters. Every stream a job's workers write to is bounded
// from the spec: the largest message (a shard plus headers), the bytes and messages it may hold
// (JobStorageBound), and what happens beyond them: refusal at publish time (DiscardNew), never the
// eviction of an accepted gradient.
//
// A job with several gradient streams (spec gradient_streams) gets one per group of shards
// (wire.GradStreamOf), each bound to its shards' subjects and bounded for them; stream g is placed
// on the servers of nodes[g mod len(nodes)] (by their JetStream tag, wire.NodeTag) where such
// servers are, else where JetStream chooses.
//
// Each stream's sequences start at FirstSeq(rec), above any sequence an earlier job of the same id
// used: see FirstSeq.
func CreateJobStreams(ctx context.Context, js jetstream.JetStream, rec *job.Record, maxPayload int64, nodes []string) error {
	id := rec.Spec.ID
	first := FirstSeq(rec)
	storage := jetstream.MemoryStorage
	if rec.Spec.Storage == "file" {
		storage = jetstream.FileStorage
	}
	gradBytes, _ := JobStorageBound(rec)
	shards := int64(rec.Layout.NumShards())
	// A direct-gradients job has no gradient stream: its gradients go to the runtimes as core NATS
	// requests, and a stream bound to their subjects would store them and answer for the runtime.
	switch n := rec.Spec.GradStreams(); {
	case n == 1:
		if err := createStream(ctx, js, jetstream.StreamConfig{
			Name:        wire.GradStream(id),
			Description: "fanin gradients of job " + id,
			Subjects:    []string{wire.GradWildcard(id)},
			Storage:     storage,
			Replicas:    rec.Spec.Replicas,
			Retention:   jetstream.LimitsPolicy,
			Discard:     jetstream.DiscardNew,
			MaxMsgSize:  min(GradMaxMsgSize(rec), int32(min(maxPayload, 1<<31-1))),
			MaxBytes:    gradBytes,
			MaxMsgs:     int64(rec.Spec.Ranks) * shards * GradWindow(&rec.Spec),
			Duplicates:  2 * time.Minute,
			FirstSeq:    first,
		}); err != nil {
			return fmt.Errorf("create gradient stream of job %s: %w", id, err)
		}
	case n > 1:
		for g := range n {
			subjects := wire.GradGroupSubjects(id, n, g, int(shards))
			cfg := jetstream.StreamConfig{
				Name:        wire.GradGroupStream(id, g),
				Description: fmt.Sprintf("fanin gradients of job %s, shards %d mod %d", id, g, n),
				Subjects:    subjects,
				Storage:     storage,
				Replicas:    rec.Spec.Replicas,
				Retention:   jetstream.LimitsPolicy,
				Discard:     jetstream.DiscardNew,
				MaxMsgSize:  min(GradMaxMsgSize(rec), int32(min(maxPayload, 1<<31-1))),
				MaxBytes:    groupGradBound(rec, n, g),
				MaxMsgs:     int64(rec.Spec.Ranks) * int64(len(subjects)) * GradWindow(&rec.Spec),
				Duplicates:  2 * time.Minute,
				FirstSeq:    first,
			}
			if err := createPlaced(ctx, js, cfg, nodes, g); err != nil {
				return fmt.Errorf("create gradient stream %d of %d of job %s: %w", g, n, id, err)
			}
		}
	}
	if err := createStream(ctx, js, jetstream.StreamConfig{
		Name:              wire.ParamsStream(id),
		Description:       "fanin parameters and checkpoints of job " + id,
		Subjects:          []string{wire.ParamsWildcard(id), wire.CkptWildcard(id)},
		Storage:           storage,
		Replicas:          rec.Spec.Replicas,
		MaxMsgsPerSubject: ParamsHistory,
		AllowDirect:       true,
		Duplicates:        2 * time.Minute,
		FirstSeq:          first,
	}); err != nil {
		return fmt.Errorf("create parameter stream of job %s: %w", id, err)
	}
	if rec.Spec.Init.Kind == "upload" {
		// One message per shard, written once: a second upload of a shard is refused by JetStream
		// (DiscardNewPerSubject), so the initial parameters cannot change once stored. The stream
		// binds each shard's subject, not a wildcard: an upload to a shard id outside the layout
		// finds no stream and is refused at publish ("no responders"); stored, it would take one
		// of the stream's places for good, and the last real shard's upload would be refused.
		// job.MaxUploadShards bounds the list.
		model := int64(0)
		for _, s := range rec.Layout.Shards {
			model += int64(s.Bytes()) + MaxGradHeaders
		}
		if err := createStream(ctx, js, jetstream.StreamConfig{
			Name:                 wire.InitStream(id),
			Description:          "fanin initial parameters uploaded for job " + id,
			Subjects:             wire.InitSubjects(id, int(shards)),
			Storage:              storage,
			Replicas:             rec.Spec.Replicas,
			Discard:              jetstream.DiscardNew,
			DiscardNewPerSubject: true,
			MaxMsgsPerSubject:    1,
			MaxMsgs:              shards,
			FirstSeq:             first,
			MaxBytes:             model,
			MaxMsgSize:           min(GradMaxMsgSize(rec), int32(min(maxPayload, 1<<31-1))),
			AllowDirect:          true,
			Duplicates:           2 * time.Minute,
		}); err != nil {
			return fmt.Errorf("create upload stream of job %s: %w", id, err)
		}
	}
	return nil
}

// groupGradBound is the bytes the gradient stream of group g (of n) of rec's job may hold: its
// shards' part of JobStorageBound.
func groupGradBound(rec *job.Record, n, g int) int64 {
	var b int64
	for _, s := range rec.Layout.Shards {
		if s.ID%n == g {
			b += int64(rec.Spec.Ranks) * (int64(s.Bytes()) + MaxGradHeaders)
		}
	}
	return b * GradWindow(&rec.Spec)
}

// createPlaced creates the stream of cfg on the servers of node nodes[g mod len(nodes)] (those
// tagged wire.NodeTag of it), or, where no server of the cluster carries that tag (or nodes is
// empty), where JetStream places it. A server that is no cluster's member ignores the tag.
func createPlaced(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, nodes []string, g int) error {
	if len(nodes) > 0 {
		placed := cfg
		placed.Placement = &jetstream.Placement{Tags: []string{wire.NodeTag(nodes[g%len(nodes)])}}
		err := createStream(ctx, js, placed)
		if !noPeers(err) {
			return err
		}
	}
	return createStream(ctx, js, cfg)
}

// MoveStream moves stream name, of one replica, to the servers tagged tag (wire.NodeTag of a node):
// JetStream adds a peer there, catches it up, moves the stream's consumers and removes the old
// peer, the stream taking messages throughout. It reports whether it asked for a move: a stream
// placed by tag already is left as it is, and one of several replicas is refused (no node has
// that many servers).
func MoveStream(ctx context.Context, js jetstream.JetStream, name, tag string) (bool, error) {
	st, err := js.Stream(ctx, name)
	if err != nil {
		return false, err
	}
	cfg := st.CachedInfo().Config
	if cfg.Replicas > 1 {
		return false, fmt.Errorf("stream %s has %d replicas: only a stream of one is moved to a node", name, cfg.Replicas)
	}
	if p := cfg.Placement; p != nil && len(p.Tags) == 1 && p.Tags[0] == tag {
		return false, nil
	}
	cfg.Placement = &jetstream.Placement{Tags: []string{tag}}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return false, err
	}
	return true, nil
}

// noPeers reports whether err is JetStream's refusal to place a stream: no server (or not enough
// of them for its replicas) carries the placement's tags, or none has room.
func noPeers(err error) bool {
	var apiErr *jetstream.APIError
	return peersUnknown(err) || errors.As(err, &apiErr) && apiErr.ErrorCode == errInsufficientResources
}

// createStream creates one of a job's streams, and again, up to 8 times over about 4 s, while a server
// of the cluster fails to create its store (storeRace: on a file-storage cluster, a job created while
// a server sets up the account's directory, or deleted and created again at once). JetStream treats
// a second creation of the same stream as the first, so a creation that was answered with neither
// the stream nor an error is safe to repeat too.
func createStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	wait := 50 * time.Millisecond
	for try := 1; ; try++ {
		_, err := js.CreateStream(ctx, cfg)
		if err == nil || !storeRace(err) || try == 8 {
			return err
		}
		if onStoreRace != nil {
			onStoreRace(cfg.Name)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// onStoreRace, when set (tests), runs when createStream is about to create a stream again.
var onStoreRace func(stream string)

// DeleteJobStreams removes a job's streams, its node checkpoint streams (which the runtimes
// create) included; missing streams are not an error.
func DeleteJobStreams(ctx context.Context, js jetstream.JetStream, id string) error {
	var errs []error
	all := []string{wire.GradStream(id), wire.ParamsStream(id), wire.InitStream(id)}
	names := js.StreamNames(ctx, jetstream.WithStreamListSubject(wire.NodeCkptFilter(id)))
	for name := range names.Name() {
		if strings.HasPrefix(name, wire.NodeCkptStreamPrefix(id)) {
			all = append(all, name)
		}
	}
	if err := names.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		errs = append(errs, fmt.Errorf("list the node checkpoint streams of job %s: %w", id, err))
	}
	grads := js.StreamNames(ctx, jetstream.WithStreamListSubject(wire.GradWildcard(id)))
	for name := range grads.Name() {
		if strings.HasPrefix(name, wire.GradStream(id)+"_") { // the job's gradient groups
			all = append(all, name)
		}
	}
	if err := grads.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		errs = append(errs, fmt.Errorf("list the gradient streams of job %s: %w", id, err))
	}
	for _, name := range all {
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			errs = append(errs, fmt.Errorf("delete stream %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// PublishInitial publishes the step-0 parameters of every shard computed from the spec's init.
func PublishInitial(ctx context.Context, js jetstream.JetStream, rec *job.Record) error {
	var buf []float32
	var out []byte
	for _, s := range rec.Layout.Shards {
		buf = resize(buf, s.Len)
		rec.Spec.InitShard(s.Off, buf)
		out = resizeBytes(out, s.Bytes())
		wire.Encode(out, buf, wire.F32)
		if err := PublishParams(ctx, js, rec.Spec.ID, wire.Incarnation(rec.Created), s.ID, 0, 0, out); err != nil {
			return err
		}
	}
	return nil
}

// PublishParams publishes (idempotently, by message id) one shard's parameters after step, of the
// job's incarnation inc (wire.Incarnation).
func PublishParams(ctx context.Context, js jetstream.JetStream, jobID, inc string, shard int, step int64, seq uint64, data []byte) error {
	m := wire.ParamsMsg(jobID, inc, shard, step, seq, data)
	if _, err := js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("publish parameters of shard %d step %d: %w", shard, step, err)
	}
	return nil
}

func resize(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

func resizeBytes(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}
