package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// A job's elastic workers (wire.Assignment): who holds which logical ranks, as the autoscaler
// leader assigns them, and the job's target worker count (job.Record.Workers), which steers it.

// ErrBadTarget is a target worker count out of range: 0 (every live worker) to the job's ranks.
var ErrBadTarget = errors.New("bad target worker count")

// Workers returns a job's elastic workers as the view last saw their assignment; a job none of
// whose elastic workers ever beat has none listed.
func (s *Server) Workers(ctx context.Context, id string) (*api.JobWorkers, error) {
	rec, _, err := s.record(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.workersOf(rec), nil
}

// workersOf builds a job's workers document from its record and the view's assignment.
func (s *Server) workersOf(rec *job.Record) *api.JobWorkers {
	out := &api.JobWorkers{Job: rec.Spec.ID, Ranks: rec.Spec.Ranks, Target: rec.Workers,
		Workers: []api.WorkerStatus{}, Unassigned: []int{}}
	a, ok := s.view.Assignment(rec.Spec.ID)
	if !ok {
		return out
	}
	now := s.now()
	updated := a.Updated
	out.Epoch, out.Updated = a.Epoch, &updated
	if a.Unassigned != nil {
		out.Unassigned = a.Unassigned
	}
	for _, w := range a.Workers {
		if w.Ranks == nil {
			w.Ranks = []int{}
		}
		out.Workers = append(out.Workers, api.WorkerStatus{AssignedWorker: w, BeatAgeMs: max(0, ms(now.Sub(w.LastBeat)))})
		if w.Standby {
			out.Standby++
		}
	}
	out.Live = len(out.Workers)
	return out
}

// liveWorkers is how many elastic workers a job's latest assignment lists.
func (s *Server) liveWorkers(id string) int {
	a, _ := s.view.Assignment(id)
	return len(a.Workers)
}

// SetWorkers sets a job's target worker count (job.Record.Workers): 0, every live elastic worker
// holds ranks; n (at most the job's ranks), the first n to join do and the others stand by. The
// autoscaler leader reassigns the ranks within a fraction of a second. The record in the jobs
// bucket is changed by compare-and-set; a paused job keeps its target when it resumes.
func (s *Server) SetWorkers(ctx context.Context, id string, target int) (*job.Record, error) {
	unlock := s.lockJob(id) // one change at a time with pause, resume and delete
	defer unlock()
	rec, _, err := s.record(ctx, id)
	if err != nil {
		return nil, err
	}
	if target < 0 || target > rec.Spec.Ranks {
		return nil, fmt.Errorf("%w: target %d: job %q has %d ranks; give 0 (every live worker holds ranks) to %d",
			ErrBadTarget, target, id, rec.Spec.Ranks, rec.Spec.Ranks)
	}
	changed := false
	rec, err = s.updateRecord(ctx, id, func(r *job.Record) error {
		changed = r.Workers != target
		r.Workers = target
		return nil
	})
	if err != nil {
		return nil, err
	}
	if changed {
		s.log.Info("job's target worker count set", "job", id, "workers", target)
	}
	return rec, nil
}

func (s *Server) jobWorkers(w http.ResponseWriter, r *http.Request) {
	ws, err := s.Workers(r.Context(), r.PathValue("id"))
	if s.jobErr(w, err) {
		return
	}
	writeJSON(w, http.StatusOK, ws)
}

func (s *Server) setJobWorkers(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req api.WorkersRequest
	if !s.readJSONRequest(w, r, &req, id, "workers request", `: send {"target": n}`) {
		return
	}
	if req.Target == nil {
		s.reject(w, wire.ReasonBadParameter, `workers request: no target: send {"target": n}, n from 0 (every live worker holds ranks) to the job's ranks`, id)
		return
	}
	rec, err := s.SetWorkers(r.Context(), id, *req.Target)
	if errors.Is(err, ErrBadTarget) {
		s.reject(w, wire.ReasonBadParameter, err.Error(), id)
		return
	}
	if s.jobErr(w, err) {
		return
	}
	writeJSON(w, http.StatusOK, s.workersOf(rec))
}
