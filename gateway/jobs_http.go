package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/job/jobyaml"
	"github.com/fanin-ml/fanin/wire"
)

// The HTTP handlers of the job routes: they decode a request, call the job service (jobs.go) and
// encode its answer or its error.

func (s *Server) createJob(w http.ResponseWriter, r *http.Request) {
	raw, body, reason, detail := readRawBody(w, r, specTypes, wire.ReasonInvalidSpec)
	if reason != "" {
		s.reject(w, reason, detail, NoJob)
		return
	}
	// A lenient decode names the job and the function for the rejection, whatever else is wrong.
	// The rejection is recorded under that job only if the job exists and the caller may see its
	// records: under another owner's job, anyone could add to (and evict) its records, and under an
	// id no job has yet, it would be counted against the job created next with that id.
	var loose job.Spec
	_ = json.Unmarshal(body, &loose)
	g := grantOf(r)
	recordAs := NoJob
	if validJobID(loose.ID) && s.canReach(r.Context(), g, loose.ID) {
		if _, err := s.meta(r.Context(), loose.ID); err == nil {
			recordAs = loose.ID
		}
	}
	if n := minShards(&loose); n > job.MaxShards {
		// Refused before jobyaml.Parse: validating builds the layout, shard by shard, and a spec of a
		// hundred bytes would make the gateway allocate a gigabyte to learn it has too many.
		s.reject(w, wire.ReasonInvalidSpec, fmt.Sprintf("invalid job spec: shard_size: gives at least %d shards, more than %d: use larger shards", n, job.MaxShards), recordAs)
		return
	}
	spec, err := jobyaml.Parse(raw)
	if err != nil {
		s.reject(w, specReason(&loose, err), err.Error(), recordAs)
		return
	}
	created, err := s.create(r.Context(), *spec, g)
	switch {
	case errors.Is(err, ErrJobExists):
		s.problem(w, http.StatusConflict, codeJobExists, err.Error())
	case errors.Is(err, store.ErrStorageFull):
		s.log.Warn("job refused: the NATS servers are out of storage", "job", spec.ID, "err", err)
		s.problem(w, http.StatusInsufficientStorage, string(wire.ReasonStorageFull), err.Error())
	case errors.Is(err, ErrQuota):
		s.reject(w, wire.ReasonQuotaExceeded, err.Error(), recordAs)
	case errors.Is(err, functions.ErrUnknownFunction):
		s.reject(w, wire.ReasonUnknownFunction, err.Error(), recordAs)
	case errors.Is(err, functions.ErrBadHyper):
		s.reject(w, wire.ReasonBadHyper, err.Error(), recordAs)
	case errors.Is(err, ErrHighPriority):
		s.reject(w, wire.ReasonForbidden, err.Error(), recordAs)
	case errors.Is(err, job.ErrInvalidSpec):
		s.reject(w, specReason(spec, err), err.Error(), recordAs)
	case err != nil:
		s.internal(w, "create job "+spec.ID, err)
	default:
		writeJSON(w, http.StatusCreated, created)
	}
}

// minShards is a lower bound of the number of shards of a spec's layout, computed without building
// it: a tensor larger than a shard is split into ceil(n/target) shards of its own.
func minShards(s *job.Spec) int64 {
	size := int64(s.ShardSize)
	if size <= 0 {
		size = job.DefaultShardSize
	}
	target := max(1, size/4)
	var n int64
	for _, t := range s.Tensors {
		elems := int64(1)
		for _, d := range t.Shape {
			if d < 1 {
				elems = 0
				break
			}
			if elems > job.MaxElements/int64(d) {
				elems = job.MaxElements + 1
				break
			}
			elems *= int64(d)
		}
		if elems > target {
			n += (elems + target - 1) / target
		}
		if n > job.MaxShards {
			break
		}
	}
	return n
}

// specReason names what is wrong with a spec that failed validation with err: its function, its
// hyper-parameters, or something else.
func specReason(spec *job.Spec, err error) wire.Reason {
	var se *job.SpecError
	if !errors.As(err, &se) {
		return wire.ReasonInvalidSpec // it did not decode
	}
	fnBad := false
	for _, f := range se.Fields {
		fnBad = fnBad || f.Field == "function"
	}
	if !fnBad {
		return wire.ReasonInvalidSpec
	}
	_, err = functions.New(spec.Function.Name, spec.Function.Hyper)
	switch {
	case errors.Is(err, functions.ErrUnknownFunction):
		return wire.ReasonUnknownFunction
	case errors.Is(err, functions.ErrBadHyper):
		return wire.ReasonBadHyper
	}
	return wire.ReasonInvalidSpec
}

func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) {
	g := grantOf(r)
	out := api.JobList{Jobs: []api.JobStatus{}}
	for _, rec := range s.records() {
		if !s.canReach(r.Context(), g, rec.Spec.ID) {
			continue
		}
		st, err := s.Status(r.Context(), rec.Spec.ID, false)
		if errors.Is(err, ErrJobNotFound) {
			continue
		}
		if err != nil {
			s.internal(w, "list jobs", err)
			return
		}
		out.Jobs = append(out.Jobs, *st)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getJob(w http.ResponseWriter, r *http.Request) {
	st, err := s.Status(r.Context(), r.PathValue("id"), true)
	if s.jobErr(w, err) {
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) jobShards(w http.ResponseWriter, r *http.Request) {
	st, err := s.Status(r.Context(), r.PathValue("id"), true)
	if s.jobErr(w, err) {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"job": st.Spec.ID, "state": st.State, "step": st.Step, "shards": st.Shards})
}

// jobErr answers an error of a job route; it reports whether there was one.
func (s *Server) jobErr(w http.ResponseWriter, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, ErrJobNotFound):
		s.problem(w, http.StatusNotFound, codeJobNotFound, err.Error())
	case errors.Is(err, ErrBadState):
		s.problem(w, http.StatusConflict, codeBadState, err.Error())
	default:
		s.internal(w, "job", err)
	}
	return true
}

func (s *Server) deleteJob(w http.ResponseWriter, r *http.Request) {
	if s.jobErr(w, s.DeleteJob(r.Context(), r.PathValue("id"))) {
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pauseJob(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if s.jobErr(w, s.Pause(r.Context(), id, api.StatePaused, "paused through the API")) {
		return
	}
	s.getJob(w, r)
}

func (s *Server) resumeJob(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if s.jobErr(w, s.Resume(r.Context(), id, api.StatePaused, api.StateThrottled)) {
		return
	}
	s.getJob(w, r)
}

func (s *Server) jobCredentials(w http.ResponseWriter, r *http.Request) {
	creds, err := s.issueCredentials(r.Context(), r.PathValue("id"))
	if errors.Is(err, errNoAuthority) {
		s.problem(w, http.StatusNotImplemented, codeNoCredentials, err.Error())
		return
	}
	if s.jobErr(w, err) {
		return
	}
	writeJSON(w, http.StatusCreated, creds)
}
