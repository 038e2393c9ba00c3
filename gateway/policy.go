package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/wire"
)

// Policy returns the autoscaler policy in force: the one stored in the policy bucket (the
// autoscaler follows it live), or the default it was started with.
func (s *Server) Policy(ctx context.Context) (*api.PolicyDoc, error) {
	e, err := s.buckets.Policy.Get(ctx, autoscaler.PolicyKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &api.PolicyDoc{Policy: s.policy, YAML: s.policy.YAML(), Source: "default"}, nil
	}
	if err != nil {
		return nil, err
	}
	p, err := autoscaler.ParsePolicy(e.Value())
	if err != nil {
		return nil, fmt.Errorf("the stored policy (revision %d) does not parse: %w", e.Revision(), err)
	}
	at := e.Created().UTC()
	return &api.PolicyDoc{Policy: p, YAML: p.YAML(), Source: "stored", Revision: e.Revision(), Updated: &at}, nil
}

func (s *Server) getPolicy(w http.ResponseWriter, r *http.Request) {
	doc, err := s.Policy(r.Context())
	if err != nil {
		s.internal(w, "get policy", err)
		return
	}
	writeJSON(w, http.StatusOK, doc)
}

// putPolicy replaces the policy with a validated one; absent knobs take their defaults.
func (s *Server) putPolicy(w http.ResponseWriter, r *http.Request) {
	body, reason, detail := readBody(w, r, specTypes, wire.ReasonInvalidPolicy)
	if reason != "" {
		s.reject(w, reason, detail, NoJob)
		return
	}
	p, err := autoscaler.ParsePolicy(body)
	if err != nil {
		s.reject(w, wire.ReasonInvalidPolicy, err.Error(), NoJob)
		return
	}
	if _, err := s.buckets.Policy.Put(r.Context(), autoscaler.PolicyKey, []byte(p.YAML())); err != nil {
		s.internal(w, "store policy", err)
		return
	}
	s.log.Info("policy replaced", "min_runtimes", p.MinRuntimes, "max_runtimes", p.MaxRuntimes)
	s.getPolicy(w, r)
}

// policyHistory lists the stored revisions of the policy, oldest first (the bucket keeps 64).
func (s *Server) policyHistory(w http.ResponseWriter, r *http.Request) {
	out := []api.PolicyRevision{}
	hist, err := s.buckets.Policy.History(r.Context(), autoscaler.PolicyKey)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		s.internal(w, "policy history", err)
		return
	}
	for _, e := range hist {
		pr := api.PolicyRevision{Revision: e.Revision(), Updated: e.Created().UTC(), YAML: string(e.Value())}
		if e.Operation() != jetstream.KeyValuePut {
			pr.Deleted = true
		} else if p, err := autoscaler.ParsePolicy(e.Value()); err != nil {
			pr.Error = err.Error()
		} else {
			pr.Policy = p
		}
		out = append(out, pr)
	}
	writeJSON(w, http.StatusOK, map[string]any{"history": out})
}

// queryInt reads an integer query parameter in [lo, hi].
func queryInt(r *http.Request, name string, def, lo, hi int) (int, string) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, ""
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Sprintf("query parameter %s=%q: want an integer in %d..%d", name, v, lo, hi)
	}
	return n, ""
}

// Decisions returns the autoscaler's latest decisions that changed something, oldest first, from
// the stream FANIN_DECISIONS.
func (s *Server) Decisions(ctx context.Context, limit int) ([]autoscaler.Decision, error) {
	out := []autoscaler.Decision{}
	st, err := s.js.Stream(ctx, wire.DecisionsStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return out, nil // no autoscaler has run yet
	}
	if err != nil {
		return nil, err
	}
	last := st.CachedInfo().State.LastSeq
	if last == 0 || st.CachedInfo().State.Msgs == 0 {
		return out, nil
	}
	first := max(st.CachedInfo().State.FirstSeq, last-min(last, uint64(limit))+1)
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: first,
		FilterSubjects: []string{wire.DecisionsSubject}, // not the leaders' fence
	})
	if err != nil {
		return nil, err
	}
	for len(out) < limit {
		batch, err := cons.FetchNoWait(limit - len(out))
		if err != nil {
			return nil, err
		}
		got := 0
		var seq uint64
		for m := range batch.Messages() {
			got++
			var d autoscaler.Decision
			if json.Unmarshal(m.Data(), &d) == nil {
				out = append(out, d)
			}
			if md, err := m.Metadata(); err == nil {
				seq = md.Sequence.Stream
			}
		}
		if got == 0 || seq >= last {
			break
		}
	}
	return out, nil
}

func (s *Server) listDecisions(w http.ResponseWriter, r *http.Request) {
	limit, bad := queryInt(r, "limit", 20, 1, 1000)
	if bad != "" {
		s.reject(w, wire.ReasonBadParameter, bad, NoJob)
		return
	}
	ds, err := s.Decisions(r.Context(), limit)
	if err != nil {
		s.internal(w, "read decisions", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"decisions": ds})
}
