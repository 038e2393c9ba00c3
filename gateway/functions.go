package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/functions/wasmfn"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// User functions: POST /v1/functions stores a WebAssembly module under a name and version owned
// by the caller's team (or the admin), content-addressed; a job spec names it owner/name@version,
// and a team's jobs reach only its own functions and the built-ins; a function a job uses cannot
// be deleted. The gateway checks every upload on an engine of its own (the same checks a runtime
// makes before it runs a module) and validates a job's hyper-parameters against the module's
// declaration. See docs/FUNCTIONS.md.

// Problem codes of the functions routes.
const (
	codeFunctionNotFound = "function_not_found"
	codeFunctionExists   = "function_exists"
	codeFunctionInUse    = "function_in_use"
	codeFunctionStart    = "function_start_timeout"
)

// userFunctions is the gateway's part of the user functions: the store and the engine that checks
// modules, opened at first use.
type userFunctions struct {
	limits wasmfn.Limits // zero: wasmfn's defaults
	once   sync.Once
	err    error
	store  *store.Functions
	engine *wasmfn.Engine
}

func (s *Server) userFuncs(ctx context.Context) (*store.Functions, *wasmfn.Engine, error) {
	u := &s.fns
	u.once.Do(func() {
		if u.store, u.err = store.OpenFunctions(ctx, s.js); u.err != nil {
			return
		}
		u.engine, u.err = wasmfn.NewEngine(s.bg, u.limits)
	})
	if u.err != nil {
		// Not kept: the next request tries again (NATS may have been restarting).
		err := u.err
		s.fns = userFunctions{limits: u.limits}
		return nil, nil, err
	}
	return u.store, u.engine, nil
}

var functionNamePattern = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)

// FunctionUpload is the answer to an upload.
type FunctionUpload struct {
	Function string        `json:"function"` // owner/name@version, as a job spec names it
	Digest   string        `json:"digest"`
	Size     int           `json:"size"`
	Created  bool          `json:"created"` // false: the same bytes were there already
	Info     wasmfn.Info   `json:"info"`
	Limits   wasmfn.Limits `json:"limits"`
}

func (s *Server) uploadFunction(w http.ResponseWriter, r *http.Request) {
	g := grantOf(r)
	q := r.URL.Query()
	name, owner := q.Get("name"), g.owner()
	if o := q.Get("owner"); o != "" && o != owner {
		if !g.admin() {
			s.reject(w, wire.ReasonForbidden, "owner "+strconv.Quote(o)+": a team uploads only its own functions", NoJob)
			return
		}
		owner = o
	}
	version, err := strconv.Atoi(q.Get("version"))
	switch {
	case !functionNamePattern.MatchString(name):
		s.reject(w, wire.ReasonBadParameter, fmt.Sprintf("name %q: want 1-63 characters of a-z, 0-9, '_' and '-', starting with a letter", name), NoJob)
		return
	case err != nil || version < 1 || version > 999999999:
		s.reject(w, wire.ReasonBadParameter, fmt.Sprintf("version %q: want a whole number from 1", q.Get("version")), NoJob)
		return
	}
	if _, ok := job.ParseFunctionRef(owner + "/" + name + "@1"); !ok {
		s.reject(w, wire.ReasonBadParameter, fmt.Sprintf("owner %q cannot own functions", owner), NoJob)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || (mt != "application/wasm" && mt != "application/octet-stream") {
			s.reject(w, wire.ReasonMediaType, fmt.Sprintf("Content-Type %q: send the module as application/wasm", ct), NoJob)
			return
		}
	}
	fns, engine, err := s.userFuncs(r.Context())
	if err != nil {
		s.internal(w, "open the functions store", err)
		return
	}
	limit := engine.Limits().MaxModuleBytes
	code, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(limit)+1))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		s.reject(w, wire.ReasonBodyTooLarge, fmt.Sprintf("the module is over %d bytes, the most a function module may have", limit), NoJob)
		return
	case err != nil:
		s.reject(w, wire.ReasonBadModule, "read the module: "+err.Error(), NoJob)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	mod, err := engine.Load(ctx, code)
	if err != nil {
		if errors.Is(err, wasmfn.ErrBadModule) {
			s.reject(w, wire.ReasonBadModule, err.Error(), NoJob)
			return
		}
		if errors.Is(err, wasmfn.ErrTimeLimit) {
			// Not a verdict on the module: a gateway too busy to start it in time looks the same
			// as a module whose start never ends. Nothing was stored; the upload may be retried.
			s.log.Warn("check the module", "err", err)
			w.Header().Set("Retry-After", "10")
			s.problem(w, http.StatusServiceUnavailable, codeFunctionStart, "check the module: "+err.Error()+
				" (the gateway may be too busy to start it in time: try again; a module that never finishes starting fails every time)")
			return
		}
		s.internal(w, "check the module", err)
		return
	}
	info, _ := json.Marshal(mod.Info())
	rec := store.FunctionRecord{Owner: owner, Name: name, Version: version, Digest: mod.Digest(), Size: len(code),
		Created: s.now().UTC(), Info: info}
	created, err := fns.Put(ctx, rec, code)
	switch {
	case errors.Is(err, store.ErrFunctionExists):
		s.problem(w, http.StatusConflict, codeFunctionExists, err.Error()+": a version is never replaced; push a new version")
		return
	case err != nil:
		s.internal(w, "store function "+rec.Ref(), err)
		return
	}
	status := http.StatusCreated
	if !created {
		status = http.StatusOK
	}
	s.log.Info("function uploaded", "function", rec.Ref(), "digest", rec.Digest, "bytes", len(code), "new", created)
	writeJSON(w, status, FunctionUpload{Function: rec.Ref(), Digest: rec.Digest, Size: len(code), Created: created,
		Info: mod.Info(), Limits: engine.Limits()})
}

// listFunctions lists the built-in functions and the user functions the caller reaches: a team's
// own, every one for the admin.
func (s *Server) listFunctions(w http.ResponseWriter, r *http.Request) {
	out := map[string]any{"functions": functions.Describe(), "modules": []store.FunctionRecord{}}
	g := grantOf(r)
	if g.Kind == auth.KindJob {
		writeJSON(w, http.StatusOK, out)
		return
	}
	fns, _, err := s.userFuncs(r.Context())
	if err != nil {
		s.internal(w, "open the functions store", err)
		return
	}
	owner := g.owner()
	if g.admin() {
		owner = ""
	}
	recs, err := fns.List(r.Context(), owner)
	if err != nil {
		s.internal(w, "list functions", err)
		return
	}
	out["modules"] = recs
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteFunction(w http.ResponseWriter, r *http.Request) {
	g := grantOf(r)
	ref, ok := job.ParseFunctionRef(r.PathValue("owner") + "/" + r.PathValue("function"))
	if !ok {
		s.reject(w, wire.ReasonBadParameter, fmt.Sprintf("%s/%s: want /v1/functions/<owner>/<name>@<version>", r.PathValue("owner"), r.PathValue("function")), NoJob)
		return
	}
	if !g.admin() && ref.Owner != g.owner() {
		s.problem(w, http.StatusNotFound, codeFunctionNotFound, "no function "+ref.String()+" that your token reaches")
		return
	}
	fns, _, err := s.userFuncs(r.Context())
	if err != nil {
		s.internal(w, "open the functions store", err)
		return
	}
	var users []string
	for _, rec := range s.records() {
		if rec.Spec.Function.Name == ref.String() {
			users = append(users, rec.Spec.ID)
		}
	}
	if len(users) > 0 {
		s.problem(w, http.StatusConflict, codeFunctionInUse, fmt.Sprintf("%s is used by job(s) %v: delete them first", ref, users))
		return
	}
	err = fns.Delete(r.Context(), ref.Owner, ref.Name, ref.Version)
	switch {
	case errors.Is(err, store.ErrFunctionNotFound):
		s.problem(w, http.StatusNotFound, codeFunctionNotFound, err.Error())
	case err != nil:
		s.internal(w, "delete function "+ref.String(), err)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// resolveFunction binds a spec's user function to its module: the caller must reach it (its
// team's own, any for the admin), its hyper-parameters must be valid for the module, and the spec
// records the module's digest, state vectors and weighting. A built-in function is left alone.
// Errors wrap functions.ErrUnknownFunction or functions.ErrBadHyper.
func (s *Server) resolveFunction(ctx context.Context, spec *job.Spec, g grant) error {
	if !spec.Function.IsUserFunction() {
		return nil
	}
	ref, _ := job.ParseFunctionRef(spec.Function.Name) // Validate checked it
	if !g.admin() && ref.Owner != g.owner() {
		return fmt.Errorf("function: %w %q: a team's jobs reach its own functions and the built-ins", functions.ErrUnknownFunction, ref.String())
	}
	fns, engine, err := s.userFuncs(ctx)
	if err != nil {
		return err
	}
	rec, err := fns.Get(ctx, ref.Owner, ref.Name, ref.Version)
	if errors.Is(err, store.ErrFunctionNotFound) {
		return fmt.Errorf("function: %w %q: upload it first (POST /v1/functions, fanin functions push)", functions.ErrUnknownFunction, ref.String())
	}
	if err != nil {
		return err
	}
	code, err := fns.Module(ctx, rec.Digest)
	if err != nil {
		return err
	}
	mod, err := engine.Load(ctx, code)
	if err != nil {
		return fmt.Errorf("function %s: %w", ref, err)
	}
	if _, err := mod.New(spec.Function.Name, spec.Function.Hyper, spec.AllowNonFinite); err != nil {
		return fmt.Errorf("function: %w", err)
	}
	spec.Function.Module, spec.Function.Slots, spec.Function.Weighted = rec.Digest, len(mod.Info().State), mod.Info().Weighted
	return nil
}

// functionFailed reads a runtime's function_failed report: one that asks for the job's pause
// (its user function failed a shard's step maxFunctionFailures times in a row) pauses it, in the
// background, as POST /v1/jobs/{id}/pause would.
func (s *Server) functionFailed(jobID string, data []byte) {
	rej, err := wire.UnmarshalReject(data)
	if err != nil || !rej.Pause {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := s.Pause(s.bg, jobID, api.StatePaused, string(wire.ReasonFunctionFailed)+": "+rej.Detail)
		if err != nil && !errors.Is(err, ErrBadState) && !errors.Is(err, ErrJobNotFound) && s.bg.Err() == nil {
			s.log.Warn("pause a job whose function fails", "job", jobID, "err", err)
		}
	}()
}
