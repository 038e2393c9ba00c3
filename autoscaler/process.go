package autoscaler

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
)

// ProcessDriver runs the pool as `fanin runtime` OS processes on this machine. Remove sends
// SIGTERM (the runtime checkpoints and releases its shards) and, after Grace, SIGKILL. A process
// that exits unasked is reported to OnVanished.
//
// A runtime's id is unique forever (Prefix and 12 hex digits of a random UUID), so a restarted
// driver never starts a second process with a live one's id. Runtimes do not outlive their driver:
// on Linux the kernel sends them SIGTERM when it dies, however it dies (PR_SET_PDEATHSIG); and a
// driver with a Dir records each runtime's pid there and, on its first Scale, stops the runtimes a
// previous driver of that Dir left running (SIGTERM, SIGKILL after Grace).
type ProcessDriver struct {
	Binary string   // the fanin binary
	Args   []string // after "runtime": e.g. --nats URL --creds runtime.creds
	Prefix string   // runtime ids are Prefix-<12 hex digits>
	Grace  time.Duration
	Dir    string // where the driver records its runtimes' pids (optional; one Dir per driver)
	Log    *slog.Logger
	// OnVanished is called with the id of a runtime process that exited without being removed.
	OnVanished func(id string)
	// Cores, when set and > 0 at a runtime's start, is that runtime's size: it is passed as
	// --cores, and as GOMAXPROCS so that the process uses no more. Otherwise a runtime takes (and
	// reports) every core of the machine, and the pool's runtimes on one machine each claim all of
	// it. fanin autoscaler sets it to the policy's cores_per_runtime.
	Cores func() int

	mu    sync.Mutex // guards procs, swept
	procs map[string]*runtimeProc
	swept bool // the runtimes of a previous driver of Dir were stopped
	wg    sync.WaitGroup
}

type runtimeProc struct {
	cmd      *exec.Cmd
	removing bool
	exited   chan struct{}
}

// Scale starts runtime processes until n are running.
func (d *ProcessDriver) Scale(ctx context.Context, n int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.procs == nil {
		d.procs = map[string]*runtimeProc{}
	}
	if !d.swept {
		if err := d.stopLeftovers(ctx); err != nil {
			return err
		}
		d.swept = true
	}
	for d.alive() < n {
		id := d.Prefix + "-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
		args := append([]string{"runtime", "--id", id}, d.Args...)
		cores := 0
		if d.Cores != nil {
			cores = d.Cores()
		}
		if cores > 0 {
			args = append(args, "--cores", strconv.Itoa(cores))
		}
		cmd := exec.Command(d.Binary, args...)
		if cores > 0 {
			cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(cores))
		}
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		cmd.SysProcAttr = deathSignal()
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start runtime %s: %w", id, err)
		}
		p := &runtimeProc{cmd: cmd, exited: make(chan struct{})}
		d.procs[id] = p
		if d.Dir != "" {
			if err := os.WriteFile(filepath.Join(d.Dir, id+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
				d.logger().Warn("cannot record the runtime's pid", "runtime", id, "err", err)
			}
		}
		d.logger().Info("runtime process started", "runtime", id, "pid", cmd.Process.Pid)
		d.wg.Add(1)
		go d.wait(id, p)
	}
	return nil
}

// stopLeftovers stops the runtimes a previous driver of Dir recorded and that still run as
// `fanin runtime --id <id>` (a recycled pid running something else is left alone), waiting up to
// Grace for them to exit. d.mu is held.
func (d *ProcessDriver) stopLeftovers(ctx context.Context) error {
	if d.Dir == "" {
		return nil
	}
	if err := os.MkdirAll(d.Dir, 0o700); err != nil {
		return fmt.Errorf("process driver: %w", err)
	}
	files, err := filepath.Glob(filepath.Join(d.Dir, "*.pid"))
	if err != nil {
		return err
	}
	var left []*os.Process
	for _, f := range files {
		id := strings.TrimSuffix(filepath.Base(f), ".pid")
		b, _ := os.ReadFile(f)
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if pid > 0 && runsRuntime(pid, id) {
			if p, err := os.FindProcess(pid); err == nil && p.Signal(syscall.SIGTERM) == nil {
				d.logger().Warn("stopping a runtime a previous driver left running", "runtime", id, "pid", pid)
				left = append(left, p)
			}
		}
		_ = os.Remove(f)
	}
	deadline := time.Now().Add(d.grace())
	for _, p := range left {
		for p.Signal(syscall.Signal(0)) == nil && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
		}
		_ = p.Kill()
	}
	return nil
}

// runsRuntime reports whether process pid is `fanin runtime --id id` (Linux: /proc/pid/cmdline).
func runsRuntime(pid int, id string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), "\x00runtime\x00--id\x00"+id+"\x00")
}

func (d *ProcessDriver) grace() time.Duration {
	if d.Grace == 0 {
		return 30 * time.Second
	}
	return d.Grace
}

func (d *ProcessDriver) wait(id string, p *runtimeProc) {
	defer d.wg.Done()
	err := p.cmd.Wait()
	close(p.exited)
	d.mu.Lock()
	removing := p.removing
	delete(d.procs, id)
	d.mu.Unlock()
	if d.Dir != "" {
		_ = os.Remove(filepath.Join(d.Dir, id+".pid"))
	}
	if !removing {
		if err == nil { // it stopped by itself, cleanly: the leader asked it to (a stop request)
			d.logger().Info("runtime process stopped", "runtime", id)
		} else {
			d.logger().Warn("runtime process vanished", "runtime", id, "err", err)
		}
		if d.OnVanished != nil {
			d.OnVanished(id)
		}
	}
}

// alive counts processes not being removed. d.mu is held.
func (d *ProcessDriver) alive() int {
	n := 0
	for _, p := range d.procs {
		if !p.removing {
			n++
		}
	}
	return n
}

// Size is the number of runtime processes running and not being removed.
func (d *ProcessDriver) Size() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.alive()
}

// Remove stops one runtime process: SIGTERM, then SIGKILL after Grace. It does not wait.
func (d *ProcessDriver) Remove(_ context.Context, id string) error {
	d.mu.Lock()
	p, ok := d.procs[id]
	if ok {
		p.removing = true
	}
	d.mu.Unlock()
	if !ok {
		return nil // not ours, or gone already
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		t := time.NewTimer(d.grace())
		defer t.Stop()
		select {
		case <-p.exited:
		case <-t.C:
			_ = p.cmd.Process.Kill()
		}
	}()
	d.logger().Info("runtime process stopping", "runtime", id)
	return nil
}

// Owns reports whether runtime id is a process of this driver's. The pool's other runtimes (another
// autoscaler's driver started them) are adopted by the leader, not stopped by it (see ownerDriver).
func (d *ProcessDriver) Owns(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.procs[id]
	return ok
}

// IDs lists the running runtime processes.
func (d *ProcessDriver) IDs() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := make([]string, 0, len(d.procs))
	for id := range d.procs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Kill sends SIGKILL to one runtime process, as a crash would (for tests and chaos drills).
func (d *ProcessDriver) Kill(id string) error {
	d.mu.Lock()
	p, ok := d.procs[id]
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("no runtime process %s", id)
	}
	return p.cmd.Process.Kill()
}

// Close stops every runtime process and waits for them.
func (d *ProcessDriver) Close() {
	for _, id := range d.IDs() {
		_ = d.Remove(context.Background(), id)
	}
	d.wg.Wait()
}

func (d *ProcessDriver) logger() *slog.Logger {
	if d.Log != nil {
		return d.Log
	}
	return slog.Default()
}
