package wasmfn

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// ABI is the version of the function ABI this package serves (docs/FUNCTIONS.md).
const ABI = 1

// Limits bound what one module may take. The zero value of a field takes its default.
type Limits struct {
	MaxModuleBytes int           // size of the module's bytes (default 16 MiB)
	MaxMemoryPages uint32        // 64 KiB pages of linear memory per instance (default 4096: 256 MiB)
	CallTimeout    time.Duration // one call of the function (default 2 s)
	StartTimeout   time.Duration // an instance's start, the Go runtime's initialization (default 30 s)
}

// Defaults of Limits.
const (
	DefaultMaxModuleBytes = 16 << 20
	DefaultMaxMemoryPages = 4096
	DefaultCallTimeout    = 2 * time.Second
	DefaultStartTimeout   = 30 * time.Second
	MaxSlots              = 8  // state vectors a function may declare
	MaxHyper              = 32 // hyper-parameters a function may declare
)

func (l Limits) withDefaults() Limits {
	if l.MaxModuleBytes <= 0 {
		l.MaxModuleBytes = DefaultMaxModuleBytes
	}
	if l.MaxMemoryPages == 0 {
		l.MaxMemoryPages = DefaultMaxMemoryPages
	}
	if l.CallTimeout <= 0 {
		l.CallTimeout = DefaultCallTimeout
	}
	if l.StartTimeout <= 0 {
		l.StartTimeout = DefaultStartTimeout
	}
	return l
}

// ErrBadModule is wrapped by every error of Load about the module itself: too large, not
// WebAssembly, an import fanin does not serve, an export missing, a bad descriptor. The gateway
// refuses such an upload with the error's text.
var ErrBadModule = errors.New("bad function module")

func badModule(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadModule, fmt.Sprintf(format, args...))
}

// Engine compiles modules and runs their instances; one per process serves every job. It is
// safe for concurrent use.
type Engine struct {
	limits Limits
	rt     wazero.Runtime

	mu      sync.Mutex         // guards modules
	modules map[string]*Module // by sha256
}

// NewEngine starts an engine with the given limits.
func NewEngine(ctx context.Context, limits Limits) (*Engine, error) {
	limits = limits.withDefaults()
	cfg := wazero.NewRuntimeConfig().
		WithMemoryLimitPages(limits.MaxMemoryPages).
		WithCloseOnContextDone(true) // a call past its deadline is stopped, and its instance closed
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	if err := instantiateWASI(ctx, rt); err != nil {
		_ = rt.Close(ctx)
		return nil, fmt.Errorf("wasmfn: serve WASI: %w", err)
	}
	return &Engine{limits: limits, rt: rt, modules: map[string]*Module{}}, nil
}

// Limits returns the engine's limits, defaults filled in.
func (e *Engine) Limits() Limits { return e.limits }

// Close releases every compiled module and instance.
func (e *Engine) Close(ctx context.Context) error { return e.rt.Close(ctx) }

// Digest is the content address of a module: the hex sha256 of its bytes.
func Digest(code []byte) string {
	h := sha256.Sum256(code)
	return hex.EncodeToString(h[:])
}

// Module is a compiled, checked function module.
type Module struct {
	e      *Engine
	digest string
	cm     wazero.CompiledModule
	info   Info
	hyper  []hyperDecl
}

// Info is what a module declares (its descriptor, checked).
type Info struct {
	ABI      int         `json:"abi"`
	Doc      string      `json:"doc"`
	Weighted bool        `json:"weighted"`
	State    []string    `json:"state"`
	Hyper    []HyperInfo `json:"hyper"`
}

// HyperInfo is one declared hyper-parameter.
type HyperInfo struct {
	Name     string  `json:"name"`
	Doc      string  `json:"doc"`
	Default  float64 `json:"default"`
	Required bool    `json:"required"`
	Range    string  `json:"range"`
}

type hyperDecl struct {
	HyperInfo
	r valueRange
}

// Digest returns the module's sha256 in hex.
func (m *Module) Digest() string { return m.digest }

// Info returns what the module declares.
func (m *Module) Info() Info { return m.info }

// Load checks code against the ABI, compiles it and returns the module; a module already
// loaded (same bytes) is returned from the cache. Errors about the module wrap ErrBadModule.
func (e *Engine) Load(ctx context.Context, code []byte) (*Module, error) {
	if len(code) > e.limits.MaxModuleBytes {
		return nil, badModule("%d bytes, more than the %d a module may have", len(code), e.limits.MaxModuleBytes)
	}
	d := Digest(code)
	e.mu.Lock()
	m, ok := e.modules[d]
	e.mu.Unlock()
	if ok {
		return m, nil
	}
	if len(code) < 8 || string(code[:4]) != "\x00asm" {
		return nil, badModule("not a WebAssembly module (no \\0asm magic)")
	}
	cm, err := e.rt.CompileModule(ctx, code)
	if err != nil {
		return nil, badModule("%v", err)
	}
	m = &Module{e: e, digest: d, cm: cm}
	if err := m.check(ctx); err != nil {
		_ = cm.Close(ctx)
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if old, ok := e.modules[d]; ok { // loaded meanwhile
		_ = cm.Close(ctx)
		return old, nil
	}
	e.modules[d] = m
	return m, nil
}

// exports the ABI requires, with their signatures.
var abiExports = map[string]string{
	"fanin_describe": ":I",
	"fanin_reserve":  "i:i",
	"fanin_init":     "i:I",
	"fanin_apply":    "iIiF:I",
	"memory":         "",
}

var (
	namePattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)
)

// check verifies imports and exports, then reads and checks the descriptor from a fresh instance.
func (m *Module) check(ctx context.Context) error {
	for _, f := range m.cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		w, ok := wasiFuncs[name]
		if mod != wasiModule || !ok {
			return badModule("imports %s.%s: a function may import only %s (served without files, clocks, randomness or network)", mod, name, wasiModule)
		}
		params, results := types(w.sig)
		if !sameTypes(params, f.ParamTypes()) || !sameTypes(results, f.ResultTypes()) {
			return badModule("imports %s.%s with the wrong signature", mod, name)
		}
	}
	if n := len(m.cm.ImportedMemories()); n > 0 {
		return badModule("imports a memory: a function must define its own")
	}
	exps := m.cm.ExportedFunctions()
	for name, sig := range abiExports {
		if name == "memory" {
			if _, ok := m.cm.ExportedMemories()["memory"]; !ok {
				return badModule("exports no memory named \"memory\"")
			}
			continue
		}
		f, ok := exps[name]
		if !ok {
			return badModule("exports no %s (build with the package functions/guest, docs/FUNCTIONS.md)", name)
		}
		params, results := sigTypes(sig)
		if !sameTypes(params, f.ParamTypes()) || !sameTypes(results, f.ResultTypes()) {
			return badModule("exports %s with the wrong signature", name)
		}
	}
	if mem, ok := m.cm.ExportedMemories()["memory"]; ok && mem.Min() > m.e.limits.MaxMemoryPages {
		return badModule("its memory starts at %d pages, more than the %d allowed", mem.Min(), m.e.limits.MaxMemoryPages)
	}
	inst, err := m.instantiate(ctx)
	if errors.Is(err, ErrTimeLimit) {
		// Maybe a module that never starts, maybe a machine too busy to start it in time: not
		// a verdict on the module.
		return fmt.Errorf("wasmfn: the module did not start within %v: %w", m.e.limits.StartTimeout, err)
	}
	if err != nil {
		return badModule("does not start: %v", err)
	}
	defer inst.close(ctx)
	desc, err := inst.describe(ctx)
	if errors.Is(err, ErrTimeLimit) {
		return fmt.Errorf("wasmfn: fanin_describe did not answer in time: %w", err)
	}
	if err != nil {
		return badModule("fanin_describe: %v", err)
	}
	return m.parseDescriptor(desc)
}

// sigTypes is types with 'F' for f64.
func sigTypes(s string) (params, results []api.ValueType) {
	into := &params
	for _, c := range s {
		switch c {
		case 'i':
			*into = append(*into, api.ValueTypeI32)
		case 'I':
			*into = append(*into, api.ValueTypeI64)
		case 'F':
			*into = append(*into, api.ValueTypeF64)
		case ':':
			into = &results
		}
	}
	return params, results
}

func (m *Module) parseDescriptor(desc []byte) error {
	if len(desc) > 64<<10 {
		return badModule("descriptor of %d bytes, more than 64 KiB", len(desc))
	}
	dec := json.NewDecoder(strings.NewReader(string(desc)))
	dec.DisallowUnknownFields()
	var info Info
	if err := dec.Decode(&info); err != nil {
		return badModule("descriptor: %v", err)
	}
	if info.ABI != ABI {
		return badModule("descriptor: ABI %d, this fanin serves ABI %d", info.ABI, ABI)
	}
	if len(info.Doc) > 1024 {
		return badModule("descriptor: doc of %d bytes, more than 1024", len(info.Doc))
	}
	if len(info.State) > MaxSlots {
		return badModule("descriptor: %d state vectors, more than %d", len(info.State), MaxSlots)
	}
	if info.State == nil {
		info.State = []string{}
	}
	for i, s := range info.State {
		if !namePattern.MatchString(s) {
			return badModule("descriptor: state vector name %q: want %s", s, namePattern)
		}
		if slices.Index(info.State, s) != i {
			return badModule("descriptor: state vector %q declared twice", s)
		}
	}
	if len(info.Hyper) > MaxHyper {
		return badModule("descriptor: %d hyper-parameters, more than %d", len(info.Hyper), MaxHyper)
	}
	if info.Hyper == nil {
		info.Hyper = []HyperInfo{}
	}
	for i, h := range info.Hyper {
		if !namePattern.MatchString(h.Name) {
			return badModule("descriptor: hyper-parameter name %q: want %s", h.Name, namePattern)
		}
		if slices.IndexFunc(info.Hyper, func(x HyperInfo) bool { return x.Name == h.Name }) != i {
			return badModule("descriptor: hyper-parameter %q declared twice", h.Name)
		}
		if len(h.Doc) > 1024 {
			return badModule("descriptor: hyper-parameter %q: doc of %d bytes, more than 1024", h.Name, len(h.Doc))
		}
		r, err := parseRange(h.Range)
		if err != nil {
			return badModule("descriptor: hyper-parameter %q: %v", h.Name, err)
		}
		if !h.Required && !r.ok(h.Default) {
			return badModule("descriptor: hyper-parameter %q: default %v is not %s", h.Name, h.Default, r.text())
		}
		m.hyper = append(m.hyper, hyperDecl{HyperInfo: h, r: r})
	}
	m.info = info
	return nil
}
