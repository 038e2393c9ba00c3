package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
)

// MaxSpecBytes bounds a request body.
const MaxSpecBytes = 4 << 20

// Errors callers branch on.
var (
	ErrJobExists   = errors.New("job already exists")
	ErrJobNotFound = errors.New("job not found")
)

// Server is the gateway. Create it with New and serve Handler.
type Server struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	buckets *store.Buckets
	log     *slog.Logger
	now     func() time.Time
	mux     *http.ServeMux
}

// Option configures a Server.
type Option func(*Server) error

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Server) error { s.log = l; return nil } }

// New opens the shared buckets and returns a gateway. Options: WithLogger.
func New(ctx context.Context, nc *nats.Conn, opts ...Option) (*Server, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s := &Server{nc: nc, js: js, log: slog.Default(), now: time.Now, mux: http.NewServeMux()}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	s.log = s.log.With("component", "gateway")
	if s.buckets, err = store.OpenBuckets(ctx, js); err != nil {
		return nil, err
	}
	s.mux.HandleFunc("POST /v1/jobs", s.createJob)
	s.mux.HandleFunc("GET /v1/jobs", s.listJobs)
	s.mux.HandleFunc("GET /v1/jobs/{id}", s.getJob)
	s.mux.HandleFunc("DELETE /v1/jobs/{id}", s.deleteJob)
	s.mux.HandleFunc("GET /healthz", s.healthz)
	return s, nil
}

// Handler is the gateway's HTTP handler.
func (s *Server) Handler() http.Handler { return s.mux }

// CreateJob validates a spec, creates the job's streams, publishes its initial parameters (unless
// it is uploaded) and stores its record; the record is written last, so whoever sees it finds the
// streams in place.
func (s *Server) CreateJob(ctx context.Context, spec job.Spec) (*job.Record, error) {
	spec.Normalize()
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	rec := job.NewRecord(spec, s.now())
	if err := store.CheckFits(&rec, s.nc.MaxPayload()); err != nil {
		return nil, err
	}
	if _, err := s.buckets.Jobs.Get(ctx, spec.ID); err == nil {
		return nil, fmt.Errorf("job %q: %w", spec.ID, ErrJobExists)
	}
	if err := store.CreateJobStreams(ctx, s.js, &rec, s.nc.MaxPayload()); err != nil {
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, fmt.Errorf("job %q: %w", spec.ID, ErrJobExists)
		}
		return nil, err
	}
	if spec.Init.Kind != "upload" {
		if err := store.PublishInitial(ctx, s.js, &rec); err != nil {
			_ = store.DeleteJobStreams(context.WithoutCancel(ctx), s.js, spec.ID)
			return nil, err
		}
	}
	val, _ := json.Marshal(rec)
	if _, err := s.buckets.Jobs.Create(ctx, spec.ID, val); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("job %q: %w", spec.ID, ErrJobExists)
		}
		return nil, fmt.Errorf("store job %q: %w", spec.ID, err)
	}
	s.log.Info("job created", "job", spec.ID, "ranks", spec.Ranks, "shards", rec.Layout.NumShards(),
		"elements", rec.Layout.Elements, "function", spec.Function.Name)
	return &rec, nil
}

// DeleteJob removes a job's record (its shards are then released) and its streams.
func (s *Server) DeleteJob(ctx context.Context, id string) error {
	if _, err := s.buckets.Jobs.Get(ctx, id); err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
			return fmt.Errorf("job %q: %w", id, ErrJobNotFound)
		}
		return err
	}
	if err := s.buckets.Jobs.Delete(ctx, id); err != nil {
		return fmt.Errorf("delete job %q: %w", id, err)
	}
	if err := store.DeleteJobStreams(ctx, s.js, id); err != nil {
		return err
	}
	s.log.Info("job deleted", "job", id)
	return nil
}

// Jobs lists the records of every job, sorted by id.
func (s *Server) Jobs(ctx context.Context) ([]job.Record, error) {
	lister, err := s.buckets.Jobs.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var recs []job.Record
	for key := range lister.Keys() {
		rec, err := s.job(ctx, key)
		if errors.Is(err, ErrJobNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		recs = append(recs, *rec)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Spec.ID < recs[j].Spec.ID })
	return recs, nil
}

func (s *Server) job(ctx context.Context, id string) (*job.Record, error) {
	e, err := s.buckets.Jobs.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		return nil, fmt.Errorf("job %q: %w", id, ErrJobNotFound)
	}
	if err != nil {
		return nil, err
	}
	var rec job.Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, fmt.Errorf("decode job %q: %w", id, err)
	}
	return &rec, nil
}

func (s *Server) createJob(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && mt != "application/yaml" && mt != "application/x-yaml" && mt != "text/yaml") {
			problem(w, http.StatusUnsupportedMediaType, "unsupported_media_type", fmt.Sprintf("Content-Type %q: send application/json or application/yaml", ct))
			return
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxSpecBytes))
	if err != nil {
		problem(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("a job spec is at most %d bytes", MaxSpecBytes))
		return
	}
	spec, err := job.Parse(body)
	if err != nil {
		problem(w, http.StatusBadRequest, "invalid_spec", err.Error())
		return
	}
	rec, err := s.CreateJob(r.Context(), *spec)
	switch {
	case errors.Is(err, ErrJobExists):
		problem(w, http.StatusConflict, "job_exists", err.Error())
	case errors.Is(err, job.ErrInvalidSpec):
		problem(w, http.StatusBadRequest, "invalid_spec", err.Error())
	case err != nil:
		s.log.Error("create job", "job", spec.ID, "err", err)
		problem(w, http.StatusInternalServerError, "internal", err.Error())
	default:
		writeJSON(w, http.StatusCreated, rec)
	}
}

func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) {
	recs, err := s.Jobs(r.Context())
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		problem(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	if recs == nil {
		recs = []job.Record{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": recs})
}

func (s *Server) getJob(w http.ResponseWriter, r *http.Request) {
	rec, err := s.job(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, ErrJobNotFound):
		problem(w, http.StatusNotFound, "job_not_found", err.Error())
	case err != nil:
		problem(w, http.StatusInternalServerError, "internal", err.Error())
	default:
		writeJSON(w, http.StatusOK, rec)
	}
}

func (s *Server) deleteJob(w http.ResponseWriter, r *http.Request) {
	err := s.DeleteJob(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, ErrJobNotFound):
		problem(w, http.StatusNotFound, "job_not_found", err.Error())
	case err != nil:
		problem(w, http.StatusInternalServerError, "internal", err.Error())
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if !s.nc.IsConnected() {
		problem(w, http.StatusServiceUnavailable, "nats_disconnected", "the gateway is not connected to NATS")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if _, err := s.js.AccountInfo(ctx); err != nil {
		problem(w, http.StatusServiceUnavailable, "jetstream_unavailable", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Problem is an RFC 9457 problem document with a stable machine-readable code.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

func problem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Problem{
		Type: "urn:fanin:problem:" + code, Title: http.StatusText(status), Status: status, Detail: detail, Code: code,
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
