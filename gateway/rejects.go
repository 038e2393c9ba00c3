package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/wire"
)

// Rejected inputs are kept by a stream, not by a gateway subscription: the runtimes already
// publish every rejection on fanin.v1.<job>.rejects, so a stream over fanin.v1.*.rejects keeps
// them whether or not a gateway is up, survives restarts, bounds itself per job (the latest
// RejectsPerJob), and serves any gateway replica. The gateway adds its own (API, credentials) on
// the same subjects. Counts by job and reason are exact over the job's life, not just over what
// the stream still holds: a durable consumer shared by the gateway replicas folds every
// rejection into a counter in StateBucket.
const (
	RejectsStream  = "FANIN_REJECTS"
	RejectsPerJob  = 1000
	rejectsMaxAge  = 7 * 24 * time.Hour
	countsConsumer = "fanin-gateway-counts"
	hdrSource      = "Fanin-Source" // who rejected: gateway or nats; absent: a runtime
)

// Sources of rejections.
const (
	sourceRuntime = "runtime"
	sourceGateway = "gateway"
	sourceNATS    = "nats"
)

// The log of rejected inputs reserves rejectsBytes of JetStream storage, or as much as the servers
// can give down to rejectsMinBytes: a small disk must not keep fanin from starting.
const (
	rejectsBytes    = 256 << 20
	rejectsMinBytes = 4 << 20
)

type rejectStore struct {
	s      *Server
	stream jetstream.Stream
	cons   jetstream.Consumer
	origin string           // this gateway process in wire.HdrRejectOrigin
	tally  wire.RejectTally // the rejections it recorded, by job
}

func newRejectStore(ctx context.Context, s *Server) (*rejectStore, error) {
	st, size, err := store.EnsureSizedStream(ctx, s.js, jetstream.StreamConfig{
		Name:              RejectsStream,
		Description:       "fanin rejected inputs: the latest per job",
		Subjects:          []string{wire.Prefix + "*.rejects"},
		Storage:           jetstream.FileStorage,
		MaxMsgsPerSubject: RejectsPerJob,
		MaxAge:            rejectsMaxAge,
		MaxBytes:          rejectsBytes,
		Discard:           jetstream.DiscardOld,
	}, rejectsMinBytes)
	if err != nil {
		return nil, err
	}
	if size < rejectsBytes {
		s.log.Warn("the NATS server's storage is small: the log of rejected inputs keeps less",
			"stream", RejectsStream, "bytes", size, "wanted", rejectsBytes)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: countsConsumer, Description: "fanin gateway: counts rejections by job and reason",
		AckPolicy: jetstream.AckAllPolicy, DeliverPolicy: jetstream.DeliverAllPolicy, AckWait: 30 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("rejects counter: %w", err)
	}
	return &rejectStore{s: s, stream: st, cons: cons, origin: "gateway-" + uuid.NewString()}, nil
}

// record publishes a rejection the gateway made (or learned of) on its job's rejects subject.
func (rs *rejectStore) record(rej *wire.Reject, source string) {
	m := rej.ReportMsg(rs.origin, rs.tally.Add(rej.Job, rej.Reason))
	m.Header.Set(hdrSource, source)
	if err := rs.s.nc.PublishMsg(m); err != nil {
		rs.s.log.Debug("record rejection", "job", rej.Job, "reason", rej.Reason, "err", err)
	}
}

// count folds the stream's rejections into the counters until ctx is done.
func (rs *rejectStore) count(ctx context.Context) {
	for ctx.Err() == nil {
		batch, err := rs.cons.Fetch(512, jetstream.FetchMaxWait(250*time.Millisecond))
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
			continue
		}
		add := map[string]*rejectCounts{}
		var last jetstream.Msg
		for m := range batch.Messages() {
			last = m
			jobID := jobOfSubject(m.Subject())
			if jobID == "" {
				continue
			}
			c := add[jobID]
			if c == nil {
				c = &rejectCounts{}
				add[jobID] = c
			}
			if wire.Reason(m.Headers().Get(wire.HdrReject)) == wire.ReasonFunctionFailed {
				rs.s.functionFailed(jobID, m.Data()) // functions.go: pause the job when asked
			}
			if origin := m.Headers().Get(wire.HdrRejectOrigin); origin != "" {
				if counts, err := wire.ParseCounts(m.Headers().Get(wire.HdrRejectCounts)); err == nil {
					c.observe(origin, counts)
					continue
				}
			}
			// No cumulative counts (a fanin before they existed): one rejection.
			reason := wire.Reason(m.Headers().Get(wire.HdrReject))
			if reason == "" {
				if rej, err := wire.UnmarshalReject(m.Data()); err == nil {
					reason = rej.Reason
				}
			}
			if reason != "" {
				c.addOther(reason, 1)
			}
		}
		for jobID, c := range add {
			if err := rs.add(ctx, jobID, c); err != nil && ctx.Err() == nil {
				rs.s.log.Warn("count rejections", "job", jobID, "err", err)
			}
		}
		if last != nil {
			_ = last.Ack() // acks the whole batch (AckAll): counted at least once
		}
	}
}

func jobOfSubject(subject string) string {
	rest, ok := strings.CutPrefix(subject, wire.Prefix)
	if !ok {
		return ""
	}
	j, _, _ := strings.Cut(rest, ".")
	return j
}

// rejectCounts is a job's rejection counts in StateBucket: per origin (wire.HdrRejectOrigin), the
// latest cumulative counts it announced, and the rejections that came without (older fanin).
type rejectCounts struct {
	Origins map[string]map[wire.Reason]int64 `json:"origins,omitempty"`
	Other   map[wire.Reason]int64            `json:"other,omitempty"`
}

// observe merges an origin's cumulative counts: they only grow, so the larger of two is the later.
func (c *rejectCounts) observe(origin string, counts map[wire.Reason]int64) {
	if c.Origins == nil {
		c.Origins = map[string]map[wire.Reason]int64{}
	}
	o := c.Origins[origin]
	if o == nil {
		o = map[wire.Reason]int64{}
		c.Origins[origin] = o
	}
	for r, n := range counts {
		o[r] = max(o[r], n)
	}
}

func (c *rejectCounts) addOther(r wire.Reason, n int64) {
	if c.Other == nil {
		c.Other = map[wire.Reason]int64{}
	}
	c.Other[r] += n
}

// merge folds d (a batch's observations) into c.
func (c *rejectCounts) merge(d *rejectCounts) {
	for origin, counts := range d.Origins {
		c.observe(origin, counts)
	}
	for r, n := range d.Other {
		c.addOther(r, n)
	}
}

// byReason sums the counts over origins.
func (c *rejectCounts) byReason() map[wire.Reason]int64 {
	out := map[wire.Reason]int64{}
	for _, counts := range c.Origins {
		for r, n := range counts {
			out[r] += n
		}
	}
	for r, n := range c.Other {
		out[r] += n
	}
	return out
}

func decodeCounts(b []byte) *rejectCounts {
	var c rejectCounts
	if json.Unmarshal(b, &c) == nil && (c.Origins != nil || c.Other != nil) {
		return &c
	}
	var old map[wire.Reason]int64 // the format before origins: reason -> count
	if json.Unmarshal(b, &old) == nil {
		return &rejectCounts{Other: old}
	}
	return &rejectCounts{}
}

func (rs *rejectStore) add(ctx context.Context, jobID string, d *rejectCounts) error {
	kv := rs.s.state
	for range 20 {
		c := &rejectCounts{}
		e, err := kv.Get(ctx, countsKey(jobID))
		var rev uint64
		switch {
		case err == nil:
			rev = e.Revision()
			c = decodeCounts(e.Value())
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return err
		}
		c.merge(d)
		val, _ := json.Marshal(c)
		if rev == 0 {
			_, err = kv.Create(ctx, countsKey(jobID), val)
		} else {
			_, err = kv.Update(ctx, countsKey(jobID), val, rev)
		}
		if err == nil {
			return nil
		}
		if !isWrongSeq(err) && !errors.Is(err, jetstream.ErrKeyExists) {
			return err
		}
	}
	return errors.New("counter changed concurrently too often")
}

// counts returns a job's rejection counts by reason (nil if it has none).
func (rs *rejectStore) counts(ctx context.Context, jobID string) map[wire.Reason]int64 {
	e, err := rs.s.state.Get(ctx, countsKey(jobID))
	if err != nil {
		return nil
	}
	return decodeCounts(e.Value()).byReason()
}

func (rs *rejectStore) total(ctx context.Context, jobID string) int64 {
	var n int64
	for _, c := range rs.counts(ctx, jobID) {
		n += c
	}
	return n
}

// recent returns the job's latest limit rejections, oldest first.
func (rs *rejectStore) recent(ctx context.Context, jobID string, limit int) ([]api.RejectRecord, error) {
	out := []api.RejectRecord{}
	subject := wire.RejectsSubject(jobID)
	info, err := rs.stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return nil, err
	}
	n := int(info.State.Subjects[subject])
	if n == 0 {
		return out, nil
	}
	cons, err := rs.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return nil, err
	}
	skip := max(0, n-limit)
	for read := 0; read < n; {
		batch, err := cons.Fetch(min(256, n-read), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			if read++; read <= skip {
				continue
			}
			rej, err := wire.UnmarshalReject(m.Data())
			if err != nil {
				continue
			}
			rr := api.RejectRecord{Reject: *rej, Source: sourceRuntime}
			if src := m.Headers().Get(hdrSource); src != "" {
				rr.Source = src
			}
			if md, err := m.Metadata(); err == nil {
				rr.At = md.Timestamp.UTC()
			}
			out = append(out, rr)
		}
		if got == 0 {
			break // the stream dropped some meanwhile
		}
	}
	return out, nil
}

// forget removes a deleted job's rejections and counts.
func (rs *rejectStore) forget(ctx context.Context, jobID string) {
	_ = rs.stream.Purge(ctx, jetstream.WithPurgeSubject(wire.RejectsSubject(jobID)))
	_ = rs.s.state.Delete(ctx, countsKey(jobID))
	rs.tally.Forget(jobID)
}

// Rejects returns a job's rejection counts and latest rejections.
func (s *Server) Rejects(ctx context.Context, jobID string, limit int) (*api.Rejects, error) {
	recent, err := s.rejects.recent(ctx, jobID, limit)
	if err != nil {
		return nil, err
	}
	out := &api.Rejects{Job: jobID, Counts: s.rejects.counts(ctx, jobID), Recent: recent}
	if out.Counts == nil {
		out.Counts = map[wire.Reason]int64{}
	}
	for _, n := range out.Counts {
		out.Total += n
	}
	return out, nil
}

func (s *Server) jobRejects(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	limit, bad := queryInt(r, "limit", 100, 1, RejectsPerJob)
	if bad != "" {
		s.reject(w, wire.ReasonBadParameter, bad, id)
		return
	}
	out, err := s.Rejects(r.Context(), id, limit)
	if err != nil {
		s.internal(w, "read rejections", err)
		return
	}
	if out.Total == 0 && len(out.Recent) == 0 {
		if _, _, err := s.record(r.Context(), id); errors.Is(err, ErrJobNotFound) {
			s.problem(w, http.StatusNotFound, codeJobNotFound, err.Error())
			return
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) rejectTotals(w http.ResponseWriter, r *http.Request) {
	out := api.RejectTotals{Jobs: map[string]map[wire.Reason]int64{}}
	lister, err := s.state.ListKeysFiltered(r.Context(), "rejects.*")
	if err != nil {
		s.internal(w, "list rejections", err)
		return
	}
	for k := range lister.Keys() {
		j := k[len("rejects."):]
		if c := s.rejects.counts(r.Context(), j); c != nil {
			out.Jobs[j] = c
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// RecordViolation records a permissions violation the NATS server reported (see
// embed.Config.OnViolation): credentials used where they do not reach. It is counted under the job
// the credentials belong to.
func (s *Server) RecordViolation(v embed.Violation) {
	jobID := s.jobOfUser(v.User)
	who := "credentials of job " + jobID
	if jobID == "" {
		jobID, who = NATSJob, "credentials not issued for a job"
		if v.User == "" {
			who = "a client"
		}
	}
	rej := wire.Rejectf(wire.ReasonForbidden, "NATS denied %s: %s to %q is not allowed", who, strings.ToLower(v.Kind), v.Subject)
	rej.Job = jobID
	s.rejects.record(rej, sourceNATS)
}

// jobOfJWT attributes a user JWT presented to NATS to the job whose account signed it, or to
// NATSJob when it is not one of this authority's job users (a foreign or made-up JWT).
func (s *Server) jobOfJWT(userJWT string) string {
	id, issuer := s.authz.JobOf(userJWT)
	if !validJobID(id) {
		return NATSJob
	}
	rec, _, err := s.record(context.Background(), id)
	if err != nil {
		return NATSJob
	}
	if key, err := s.authz.JobAccountKey(jobAccount(rec)); err != nil || key != issuer {
		return NATSJob
	}
	return id
}

// watchAuthErrors records the connections the NATS servers refused (bad, expired or revoked
// credentials), attributed to the job the presented credentials were issued for.
func (s *Server) watchAuthErrors() error {
	sub, err := s.sys.Subscribe("$SYS.SERVER.*.CLIENT.AUTH.ERR", func(m *nats.Msg) {
		var ev struct {
			Client struct {
				Host string `json:"host"`
				User string `json:"user"`
				Name string `json:"name"`
				JWT  string `json:"jwt"`
			} `json:"client"`
			Reason string `json:"reason"`
		}
		if json.Unmarshal(m.Data, &ev) != nil {
			return
		}
		jobID := s.jobOfJWT(ev.Client.JWT)
		rej := wire.Rejectf(wire.ReasonUnauthorized, "NATS refused a connection from %s (client %q): %s", ev.Client.Host, ev.Client.Name, ev.Reason)
		rej.Job = jobID
		s.rejects.record(rej, sourceNATS)
	})
	if err != nil {
		return fmt.Errorf("watch authentication errors: %w", err)
	}
	s.subs = append(s.subs, sub)
	return nil
}
