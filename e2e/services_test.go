package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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

// Helpers of the telemetry tests: external programs (Jaeger, Prometheus, Chromium) and fanin
// processes with their own environment.

// inCI reports whether the tests run in CI, where a missing tool fails a test instead of skipping it.
func inCI() bool { return os.Getenv("CI") == "true" }

// needTool returns the path of a program, skipping the test without it outside CI and failing in CI.
func needTool(t *testing.T, install string, names ...string) string {
	t.Helper()
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	msg := fmt.Sprintf("%s is not installed (%s)", strings.Join(names, " or "), install)
	if inCI() {
		t.Fatal(msg + "; .ci/run installs it")
	}
	t.Skip(msg)
	return ""
}

// repoRoot is the repository's root directory (the e2e tests run in e2e/).
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// extProc is a program the test started; it is killed when the test ends.
type extProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error

	mu  sync.Mutex // guards out
	out strings.Builder
}

// startProc starts bin with args and extra environment variables.
func startProc(t *testing.T, name string, env []string, bin string, args ...string) *extProc {
	t.Helper()
	p := &extProc{name: name, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.SysProcAttr = orphanGuard()
	pr, pw := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if os.Getenv("FANIN_TEST_LOG") != "" {
				fmt.Fprintf(os.Stderr, "[%s] %s\n", name, sc.Text())
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		p.err = p.cmd.Wait()
		pw.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("output of %s:\n%s", name, tail(p.output(), 60))
		}
	})
	return p
}

// startFaninProc runs the fanin binary built by TestMain.
func startFaninProc(t *testing.T, name string, env []string, args ...string) *extProc {
	t.Helper()
	return startProc(t, name, env, faninBin, args...)
}

func (p *extProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// waitOutput waits until the output matches re and returns the last submatch.
func (p *extProc) waitOutput(t *testing.T, re *regexp.Regexp, wait time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(p.output()); m != nil {
			return m[len(m)-1]
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited (%v) before printing %s:\n%s", p.name, p.err, re, tail(p.output(), 40))
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("%s did not print %s within %v:\n%s", p.name, re, wait, tail(p.output(), 40))
	return ""
}

// stop sends SIGTERM, then SIGKILL after 10 s.
func (p *extProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// alive fails the test if the program has exited.
func (p *extProc) alive(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("%s exited (%v):\n%s", p.name, p.err, tail(p.output(), 40))
	default:
	}
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = append([]string{fmt.Sprintf("... (%d lines before)", len(l)-lines)}, l[len(l)-lines:]...)
	}
	return strings.Join(l, "\n")
}

// getJSON GETs url and decodes its JSON body into v.
func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, res.Status, tail(string(body), 5))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}
