package autoscaler

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sort"
	"sync"
	"syscall"
	"time"
)

// ProcessDriver runs the pool as `fanin runtime` OS processes on this machine. Remove sends
// SIGTERM (the runtime checkpoints and releases its shards) and, after Grace, SIGKILL. A process
// that exits unasked is reported to OnVanished.
type ProcessDriver struct {
	Binary string   // the fanin binary
	Args   []string // after "runtime": e.g. --nats URL
	Prefix string   // runtime ids are Prefix-0, Prefix-1, ...
	Grace  time.Duration
	Log    *slog.Logger
	// OnVanished is called with the id of a runtime process that exited without being removed.
	OnVanished func(id string)

	mu    sync.Mutex // guards procs, next
	procs map[string]*runtimeProc
	next  int
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
	for d.alive() < n {
		id := fmt.Sprintf("%s-%d", d.Prefix, d.next)
		d.next++
		args := append([]string{"runtime", "--id", id}, d.Args...)
		cmd := exec.Command(d.Binary, args...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start runtime %s: %w", id, err)
		}
		p := &runtimeProc{cmd: cmd, exited: make(chan struct{})}
		d.procs[id] = p
		d.logger().Info("runtime process started", "runtime", id, "pid", cmd.Process.Pid)
		d.wg.Add(1)
		go d.wait(id, p)
	}
	return nil
}

func (d *ProcessDriver) wait(id string, p *runtimeProc) {
	defer d.wg.Done()
	err := p.cmd.Wait()
	close(p.exited)
	d.mu.Lock()
	removing := p.removing
	delete(d.procs, id)
	d.mu.Unlock()
	if !removing {
		d.logger().Warn("runtime process vanished", "runtime", id, "err", err)
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
	grace := d.Grace
	if grace == 0 {
		grace = 30 * time.Second
	}
	go func() {
		select {
		case <-p.exited:
		case <-time.After(grace):
			_ = p.cmd.Process.Kill()
		}
	}()
	d.logger().Info("runtime process stopping", "runtime", id)
	return nil
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
