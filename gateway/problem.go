package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job/jobyaml"
	"github.com/fanin-ml/fanin/wire"
)

// Problem is an RFC 9457 problem document with a stable machine-readable code.
type Problem = api.Problem

// Problem codes that are not rejected inputs (those are wire.Reason codes).
const (
	codeNotFound             = "not_found"
	codeMethodNotAllowed     = "method_not_allowed"
	codeJobNotFound          = "job_not_found"
	codeJobExists            = "job_exists"
	codeBadState             = "bad_state" // e.g. resume a job that is not paused
	codeInternal             = "internal"
	codeJetStreamUnavailable = "jetstream_unavailable"
	codeNoCredentials        = "credentials_disabled"
	codeTeamNotFound         = "token_not_found"
	codeRuntimeMissing       = "runtime_not_found"
)

// reasonStatus is the HTTP status of each rejection the API answers.
var reasonStatus = map[wire.Reason]int{
	wire.ReasonUnauthorized:    http.StatusUnauthorized,
	wire.ReasonForbidden:       http.StatusForbidden,
	wire.ReasonQuotaExceeded:   http.StatusTooManyRequests,
	wire.ReasonInvalidSpec:     http.StatusBadRequest,
	wire.ReasonUnknownFunction: http.StatusBadRequest,
	wire.ReasonBadHyper:        http.StatusBadRequest,
	wire.ReasonBodyTooLarge:    http.StatusRequestEntityTooLarge,
	wire.ReasonTooDeep:         http.StatusBadRequest,
	wire.ReasonMediaType:       http.StatusUnsupportedMediaType,
	wire.ReasonInvalidPolicy:   http.StatusBadRequest,
	wire.ReasonBadParameter:    http.StatusBadRequest,
}

// NoJob and NATSJob are the names under which rejections that name no job are counted: inputs of
// the HTTP API, and NATS connections fanin cannot attribute to a job. Neither is a valid job id.
const (
	NoJob   = "_api"
	NATSJob = "_nats"
)

var jobIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// validJobID reports whether id can be a job id (see job.Spec.Validate), and so a subject token.
func validJobID(id string) bool { return jobIDPattern.MatchString(id) }

// reject answers an input the API refuses: a problem document with the reason as its code, and a
// record of the rejection under the job it concerns (NoJob if none).
func (s *Server) reject(w http.ResponseWriter, reason wire.Reason, detail, jobID string) {
	status := reasonStatus[reason]
	if status == 0 {
		status = http.StatusBadRequest
	}
	if reason == wire.ReasonUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="fanin"`)
	}
	s.problem(w, status, string(reason), detail)
	if !validJobID(jobID) {
		jobID = NoJob
	}
	rej := wire.Rejectf(reason, "%s", detail)
	rej.Job = jobID
	s.rejects.record(rej, sourceGateway)
}

func (s *Server) problem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Problem{
		Type: "urn:fanin:problem:" + code, Title: http.StatusText(status), Status: status, Detail: detail, Code: code,
	})
}

// internal answers a failure of fanin's own state. One that passes by itself (a stream or meta
// leader being elected after a server was lost, a server restarting) is a 503 with Retry-After,
// not a 500: the client should retry, and nothing is wrong with its request or with fanin.
func (s *Server) internal(w http.ResponseWriter, what string, err error) {
	if store.StorageFull(err) {
		s.log.Warn(what, "err", err)
		s.problem(w, http.StatusInsufficientStorage, string(wire.ReasonStorageFull),
			what+": "+err.Error()+" (the NATS servers are out of JetStream storage: free space on their store)")
		return
	}
	if store.Transient(err) {
		s.log.Warn(what, "err", err)
		w.Header().Set("Retry-After", "2")
		s.problem(w, http.StatusServiceUnavailable, codeJetStreamUnavailable,
			what+": "+err.Error()+" (NATS did not answer: a leader election or a server restart passes in seconds; "+
				"if it lasts, a server may have stopped storing, e.g. on a full disk: see its log)")
		return
	}
	s.log.Error(what, "err", err)
	s.problem(w, http.StatusInternalServerError, codeInternal, what+": "+err.Error())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Media types a request body may have.
var (
	specTypes = []string{"application/json", "application/yaml", "application/x-yaml", "text/yaml"}
	jsonTypes = []string{"application/json"}
)

// readBody reads a request body of one of the media types (without a Content-Type it is taken
// as JSON or YAML), at most MaxSpecBytes, nested at most MaxDepth deep, and returns it as JSON; a
// body that is neither JSON nor YAML is rejected with reason bad.
//
// It returns the body converted to JSON (YAML's block style included); readRawBody also returns
// the body as sent, for parsers stricter than the conversion (jobyaml.Parse).
func readBody(w http.ResponseWriter, r *http.Request, types []string, bad wire.Reason) ([]byte, wire.Reason, string) {
	_, js, reason, detail := readRawBody(w, r, types, bad)
	return js, reason, detail
}

func readRawBody(w http.ResponseWriter, r *http.Request, types []string, bad wire.Reason) (raw, js []byte, _ wire.Reason, _ string) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		ok := err == nil
		if ok {
			ok = false
			for _, t := range types {
				ok = ok || mt == t
			}
		}
		if !ok {
			return nil, nil, wire.ReasonMediaType, fmt.Sprintf("Content-Type %q: send %s", ct, strings.Join(types, " or "))
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxSpecBytes))
	if err != nil {
		return nil, nil, wire.ReasonBodyTooLarge, fmt.Sprintf("the request body is at most %d bytes", MaxSpecBytes)
	}
	if d := flowDepth(body); d > MaxDepth {
		return nil, nil, wire.ReasonTooDeep, fmt.Sprintf("the request body is nested %d levels deep, at most %d are accepted", d, MaxDepth)
	}
	js, err = yaml.YAMLToJSON(body)
	if err != nil {
		return nil, nil, bad, fmt.Sprintf("not JSON or YAML: %v", err)
	}
	if d := flowDepth(js); d > MaxDepth {
		return nil, nil, wire.ReasonTooDeep, fmt.Sprintf("the request body is nested %d levels deep, at most %d are accepted", d, MaxDepth)
	}
	return body, js, "", ""
}

// readJSONRequest reads a JSON request body (readRawBody) and decodes it into v as strictly as a
// job spec (jobyaml.DecodeStrict: no unknown field, no key given twice). When it cannot, it rejects
// the request, recorded under jobID, with the detail "what: error" followed by hint, and returns
// false.
func (s *Server) readJSONRequest(w http.ResponseWriter, r *http.Request, v any, jobID, what, hint string) bool {
	body, _, reason, detail := readRawBody(w, r, jsonTypes, wire.ReasonBadParameter)
	if reason != "" {
		s.reject(w, reason, detail, jobID)
		return false
	}
	if err := jobyaml.DecodeStrict(body, v); err != nil {
		s.reject(w, wire.ReasonBadParameter, what+": "+err.Error()+hint, jobID)
		return false
	}
	return true
}

// flowDepth is the deepest nesting of [ and { outside quoted strings: exact for JSON, and for the
// flow style of YAML; YAML's block style shows up once the body is converted to JSON.
func flowDepth(b []byte) int {
	depth, deepest := 0, 0
	var quote byte
	for i := 0; i < len(b); i++ {
		c := b[i]
		if quote != 0 {
			switch {
			case c == '\\' && quote == '"':
				i++
			case c == quote:
				quote = 0
			}
			continue
		}
		switch c {
		case '"':
			quote = c
		case '[', '{':
			if depth++; depth > deepest {
				deepest = depth
			}
		case ']', '}':
			if depth > 0 {
				depth--
			}
		}
	}
	return deepest
}
