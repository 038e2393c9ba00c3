package e2e

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// faninBin is the fanin binary built once for all tests; natsServerBin the nats-server binary of
// the version fanin embeds (go.mod), for tests that run NATS as a process of its own.
var faninBin, natsServerBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "fanin-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	faninBin = filepath.Join(dir, "fanin")
	natsServerBin = filepath.Join(dir, "nats-server")
	for bin, pkg := range map[string]string{faninBin: "github.com/fanin-ml/fanin/cmd/fanin", natsServerBin: "github.com/nats-io/nats-server/v2"} {
		build := exec.Command("go", "build", "-o", bin, pkg)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build", pkg+":", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Tests run in parallel (t.Parallel) unless they set the environment, or their servers listen on
// ports testutil.FreePort found free or come back on the port they had: a process of a test beside
// them could take such a port first.

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test: runs without -short")
	}
}

// proc is a fanin process whose output the test can wait on.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error

	mu  sync.Mutex // guards out
	out strings.Builder
}

func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startBin(t, faninBin, name, args...)
}

// startBin starts bin as a process named name, stopped (SIGTERM) when the test ends.
func startBin(t *testing.T, bin, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.WaitDelay = 5 * time.Second // a grandchild holding the output pipe must not block Wait
	p.cmd.SysProcAttr = orphanGuard()
	pr, pw := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if os.Getenv("FANIN_TEST_LOG") != "" {
				fmt.Fprintf(os.Stderr, "[%s] %s\n", name, sc.Text())
			}
		}
	}()
	go func() {
		p.err = p.cmd.Wait()
		pw.Close()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(syscall.SIGTERM) }) // graceful: an autoscaler stops its runtimes
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// waitFor waits until the output matches re and returns the first submatch.
func (p *proc) waitFor(t *testing.T, re *regexp.Regexp, wait time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(p.output()); m != nil {
			return m[len(m)-1]
		}
		select {
		case <-p.done:
			if m := re.FindStringSubmatch(p.output()); m != nil {
				return m[len(m)-1]
			}
			t.Fatalf("%s exited (%v) before printing %s:\n%s", p.name, p.err, re, p.output())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("%s did not print %s within %v:\n%s", p.name, re, wait, p.output())
	return ""
}

func (p *proc) stop(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// wait waits for the process to exit by itself.
func (p *proc) wait(t *testing.T, limit time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		t.Fatalf("%s still running after %v:\n%s", p.name, limit, p.output())
		return nil
	}
}
