package wasmfn

import (
	"context"
	"encoding/binary"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"
)

// wasiModule is the only module a function may import from. Go's wasip1 port imports a few of
// its functions even when the function uses none of them (the Go runtime reads the clock, asks
// for random bytes and writes its panics to stderr), so fanin serves every WASI preview 1
// function, deterministically: no arguments, no environment, no files, no sockets; a clock that
// starts at the same instant at every call and advances a microsecond per reading (a sleep
// advances it at once); random bytes that are all zero; stdout and stderr kept in a small buffer
// that a failure's message quotes. Anything else is refused when a module is loaded.
const wasiModule = "wasi_snapshot_preview1"

// WASI errno values.
const (
	errnoSuccess     = 0
	errnoBadf        = 8
	errnoFault       = 21
	errnoInval       = 28
	errnoNosys       = 52
	errnoNotcapable  = 76
	clockEpoch       = 1_700_000_000_000_000_000 // ns: the fixed instant every call starts at
	clockTick        = 1000                      // ns a clock reading advances
	maxCapturedBytes = 2048                      // of stdout and stderr, per call
)

// wasiFunc is one WASI preview 1 function: its signature ('i' i32, 'I' i64; results after ':')
// and what fanin does for it; nil serves a fixed error.
type wasiFunc struct {
	sig   string
	errno uint32 // returned when fn is nil
	fn    api.GoModuleFunc
}

var wasiFuncs = map[string]wasiFunc{
	"args_get":                {sig: "ii:i", fn: okNothing},
	"args_sizes_get":          {sig: "ii:i", fn: zeroSizes},
	"environ_get":             {sig: "ii:i", fn: okNothing},
	"environ_sizes_get":       {sig: "ii:i", fn: zeroSizes},
	"clock_res_get":           {sig: "ii:i", fn: clockRes},
	"clock_time_get":          {sig: "iIi:i", fn: clockTime},
	"fd_write":                {sig: "iiii:i", fn: fdWrite},
	"poll_oneoff":             {sig: "iiii:i", fn: pollOneoff},
	"proc_exit":               {sig: "i:", fn: procExit},
	"random_get":              {sig: "ii:i", fn: randomGet},
	"sched_yield":             {sig: ":i", fn: okNothing},
	"proc_raise":              {sig: "i:i", errno: errnoNosys},
	"fd_advise":               {sig: "iIIi:i", errno: errnoBadf},
	"fd_allocate":             {sig: "iII:i", errno: errnoBadf},
	"fd_close":                {sig: "i:i", errno: errnoBadf},
	"fd_datasync":             {sig: "i:i", errno: errnoBadf},
	"fd_fdstat_get":           {sig: "ii:i", errno: errnoBadf},
	"fd_fdstat_set_flags":     {sig: "ii:i", errno: errnoBadf},
	"fd_fdstat_set_rights":    {sig: "iII:i", errno: errnoBadf},
	"fd_filestat_get":         {sig: "ii:i", errno: errnoBadf},
	"fd_filestat_set_size":    {sig: "iI:i", errno: errnoBadf},
	"fd_filestat_set_times":   {sig: "iIIi:i", errno: errnoBadf},
	"fd_pread":                {sig: "iiiIi:i", errno: errnoBadf},
	"fd_prestat_get":          {sig: "ii:i", errno: errnoBadf}, // no preopened directory
	"fd_prestat_dir_name":     {sig: "iii:i", errno: errnoBadf},
	"fd_pwrite":               {sig: "iiiIi:i", errno: errnoBadf},
	"fd_read":                 {sig: "iiii:i", errno: errnoBadf},
	"fd_readdir":              {sig: "iiiIi:i", errno: errnoBadf},
	"fd_renumber":             {sig: "ii:i", errno: errnoBadf},
	"fd_seek":                 {sig: "iIii:i", errno: errnoBadf},
	"fd_sync":                 {sig: "i:i", errno: errnoBadf},
	"fd_tell":                 {sig: "ii:i", errno: errnoBadf},
	"path_create_directory":   {sig: "iii:i", errno: errnoNotcapable},
	"path_filestat_get":       {sig: "iiiii:i", errno: errnoNotcapable},
	"path_filestat_set_times": {sig: "iiiiIIi:i", errno: errnoNotcapable},
	"path_link":               {sig: "iiiiiii:i", errno: errnoNotcapable},
	"path_open":               {sig: "iiiiiIIii:i", errno: errnoNotcapable},
	"path_readlink":           {sig: "iiiiii:i", errno: errnoNotcapable},
	"path_remove_directory":   {sig: "iii:i", errno: errnoNotcapable},
	"path_rename":             {sig: "iiiiii:i", errno: errnoNotcapable},
	"path_symlink":            {sig: "iiiii:i", errno: errnoNotcapable},
	"path_unlink_file":        {sig: "iii:i", errno: errnoNotcapable},
	"sock_accept":             {sig: "iii:i", errno: errnoNosys},
	"sock_recv":               {sig: "iiiiii:i", errno: errnoNosys},
	"sock_send":               {sig: "iiiii:i", errno: errnoNosys},
	"sock_shutdown":           {sig: "ii:i", errno: errnoNosys},
}

func types(s string) (params, results []api.ValueType) {
	into := &params
	for _, c := range s {
		switch c {
		case 'i':
			*into = append(*into, api.ValueTypeI32)
		case 'I':
			*into = append(*into, api.ValueTypeI64)
		case ':':
			into = &results
		}
	}
	return params, results
}

func sameTypes(a, b []api.ValueType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func instantiateWASI(ctx context.Context, r wazero.Runtime) error {
	b := r.NewHostModuleBuilder(wasiModule)
	for name, f := range wasiFuncs {
		params, results := types(f.sig)
		fn := f.fn
		if fn == nil {
			errno := uint64(f.errno)
			fn = func(_ context.Context, _ api.Module, stack []uint64) { stack[0] = errno }
		}
		b.NewFunctionBuilder().WithGoModuleFunction(fn, params, results).Export(name)
	}
	_, err := b.Instantiate(ctx)
	return err
}

// callState is what the WASI functions keep of one call: the clock and the captured output. It
// travels in the call's context, so instances share nothing.
type callState struct {
	clock uint64
	out   []byte
}

type callKey struct{}

func stateOf(ctx context.Context) *callState {
	if s, ok := ctx.Value(callKey{}).(*callState); ok {
		return s
	}
	return &callState{clock: clockEpoch} // a call without one (there is none): a throwaway
}

func okNothing(_ context.Context, _ api.Module, stack []uint64) { stack[0] = errnoSuccess }

func zeroSizes(_ context.Context, m api.Module, stack []uint64) {
	if !m.Memory().WriteUint32Le(uint32(stack[0]), 0) || !m.Memory().WriteUint32Le(uint32(stack[1]), 0) {
		stack[0] = errnoFault
		return
	}
	stack[0] = errnoSuccess
}

func clockRes(_ context.Context, m api.Module, stack []uint64) {
	if !m.Memory().WriteUint64Le(uint32(stack[1]), clockTick) {
		stack[0] = errnoFault
		return
	}
	stack[0] = errnoSuccess
}

func clockTime(ctx context.Context, m api.Module, stack []uint64) {
	s := stateOf(ctx)
	s.clock += clockTick
	if !m.Memory().WriteUint64Le(uint32(stack[2]), s.clock) {
		stack[0] = errnoFault
		return
	}
	stack[0] = errnoSuccess
}

func fdWrite(ctx context.Context, m api.Module, stack []uint64) {
	fd, iovs, n, written := uint32(stack[0]), uint32(stack[1]), uint32(stack[2]), uint32(stack[3])
	if fd != 1 && fd != 2 {
		stack[0] = errnoBadf
		return
	}
	s := stateOf(ctx)
	var total uint32
	for i := range n {
		ptr, ok1 := m.Memory().ReadUint32Le(iovs + 8*i)
		l, ok2 := m.Memory().ReadUint32Le(iovs + 8*i + 4)
		b, ok3 := m.Memory().Read(ptr, l)
		if !ok1 || !ok2 || !ok3 {
			stack[0] = errnoFault
			return
		}
		if room := maxCapturedBytes - len(s.out); room > 0 {
			s.out = append(s.out, b[:min(len(b), room)]...)
		}
		total += l
	}
	if !m.Memory().WriteUint32Le(written, total) {
		stack[0] = errnoFault
		return
	}
	stack[0] = errnoSuccess
}

// pollOneoff answers every clock subscription at once (advancing the clock by the longest
// timeout) and every file descriptor subscription with EBADF: a function that sleeps does not
// wait, and one that waits for input gets none.
func pollOneoff(ctx context.Context, m api.Module, stack []uint64) {
	in, out, n, nevents := uint32(stack[0]), uint32(stack[1]), uint32(stack[2]), uint32(stack[3])
	if n == 0 {
		stack[0] = errnoInval
		return
	}
	s := stateOf(ctx)
	mem := m.Memory()
	subs, ok := mem.Read(in, 48*n)
	evs, ok2 := mem.Read(out, 32*n)
	if !ok || !ok2 {
		stack[0] = errnoFault
		return
	}
	var advance uint64
	for i := range n {
		sub, ev := subs[48*i:48*i+48], evs[32*i:32*i+32]
		clear(ev)
		copy(ev[0:8], sub[0:8]) // userdata
		ev[10] = sub[8]         // type
		switch sub[8] {
		case 0: // clock: timeout at sub[24:32]; flags bit 0 = absolute
			t := binary.LittleEndian.Uint64(sub[24:32])
			if sub[40]&1 == 1 {
				t = max(t, s.clock) - s.clock
			}
			advance = max(advance, t)
		default:
			binary.LittleEndian.PutUint16(ev[8:10], errnoBadf)
		}
	}
	s.clock += advance
	if !mem.WriteUint32Le(nevents, n) {
		stack[0] = errnoFault
		return
	}
	stack[0] = errnoSuccess
}

func procExit(ctx context.Context, m api.Module, stack []uint64) {
	code := uint32(stack[0])
	_ = m.CloseWithExitCode(ctx, code)
	panic(sys.NewExitError(code))
}

func randomGet(_ context.Context, m api.Module, stack []uint64) {
	b, ok := m.Memory().Read(uint32(stack[0]), uint32(stack[1]))
	if !ok {
		stack[0] = errnoFault
		return
	}
	clear(b)
	stack[0] = errnoSuccess
}
