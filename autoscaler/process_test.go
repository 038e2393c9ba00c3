package autoscaler_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/lab/testutil"
)

// fakeRuntime is a stand-in for the fanin binary: `fakeRuntime runtime --id ID` appends its pid to
// $FAKE_PIDS and runs until SIGTERM, as a runtime would. The driver's logic is what is tested; the
// processes are real.
func fakeRuntime(t *testing.T) (bin, pids string) {
	dir := t.TempDir()
	bin, pids = filepath.Join(dir, "fanin"), filepath.Join(dir, "pids")
	script := "#!/bin/sh\necho $$ >> " + pids + "\ntrap 'exit 0' TERM\nwhile :; do sleep 0.05; done\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, pids
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil && !strings.Contains(string(b), ") Z ") // a zombie has exited
}

func readPids(t *testing.T, path string, n int) []int {
	t.Helper()
	var pids []int
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		b, _ := os.ReadFile(path)
		pids = nil
		for _, f := range strings.Fields(string(b)) {
			p, _ := strconv.Atoi(f)
			pids = append(pids, p)
		}
		if len(pids) < n {
			return fmt.Errorf("%d of %d runtimes started", len(pids), n)
		}
		return nil
	})
	return pids
}

// Runtime ids are unique and never reused, across drivers too.
func TestProcessDriverIDsUnique(t *testing.T) {
	t.Parallel()
	bin, _ := fakeRuntime(t)
	seen := map[string]bool{}
	for range 2 {
		d := &autoscaler.ProcessDriver{Binary: bin, Prefix: "rt", Log: testutil.Logger(), Grace: 5 * time.Second}
		if err := d.Scale(context.Background(), 3); err != nil {
			t.Fatal(err)
		}
		for _, id := range d.IDs() {
			if !regexp.MustCompile(`^rt-[0-9a-f]{12}$`).MatchString(id) || seen[id] {
				t.Errorf("id %q: malformed or reused", id)
			}
			seen[id] = true
		}
		d.Close()
	}
	if len(seen) != 6 {
		t.Fatalf("%d ids for 6 runtimes", len(seen))
	}
}

// A driver given the Dir of one that died stops the runtimes that one left, and only them: a pid
// recorded there that now runs something else is left alone.
func TestProcessDriverStopsLeftovers(t *testing.T) {
	t.Parallel()
	bin, pids := fakeRuntime(t)
	dir := t.TempDir()
	old := &autoscaler.ProcessDriver{Binary: bin, Prefix: "rt", Log: testutil.Logger(), Dir: dir, Grace: 5 * time.Second}
	if err := old.Scale(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	left := readPids(t, pids, 2)
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	if err := os.WriteFile(filepath.Join(dir, "rt-000000000000.pid"), []byte(strconv.Itoa(other.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	// old is never closed: as if its process had been SIGKILLed with the runtimes surviving it.
	d := &autoscaler.ProcessDriver{Binary: bin, Prefix: "rt", Log: testutil.Logger(), Dir: dir, Grace: 5 * time.Second}
	defer d.Close()
	if err := d.Scale(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, p := range left {
			if alive(p) {
				return fmt.Errorf("runtime pid %d of the dead driver still runs", p)
			}
		}
		return nil
	})
	if !alive(other.Process.Pid) {
		t.Fatal("a recycled pid running something else was killed")
	}
	if d.Size() != 1 {
		t.Fatalf("new driver runs %d runtimes, want 1", d.Size())
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
	if len(files) != 1 || !strings.Contains(files[0], d.IDs()[0]) {
		t.Fatalf("pid files %v, want only %s's", files, d.IDs()[0])
	}
}

// A runtime does not outlive its driver's process, however that dies: here a driver process is
// SIGKILLed and the kernel stops its runtimes (PR_SET_PDEATHSIG).
func TestProcessDriverRuntimesDieWithIt(t *testing.T) {
	t.Parallel()
	if os.Getenv("FANIN_TEST_DRIVER_BIN") != "" {
		d := &autoscaler.ProcessDriver{Binary: os.Getenv("FANIN_TEST_DRIVER_BIN"), Prefix: "rt", Log: testutil.Logger()}
		if err := d.Scale(context.Background(), 2); err != nil {
			os.Exit(2)
		}
		select {} // until killed
	}
	bin, pids := fakeRuntime(t)
	drv := exec.Command(os.Args[0], "-test.run=^TestProcessDriverRuntimesDieWithIt$")
	drv.Env = append(os.Environ(), "FANIN_TEST_DRIVER_BIN="+bin)
	if err := drv.Start(); err != nil {
		t.Fatal(err)
	}
	runtimes := readPids(t, pids, 2)
	if err := drv.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = drv.Wait()
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, p := range runtimes {
			if alive(p) {
				return fmt.Errorf("runtime pid %d outlived its driver", p)
			}
		}
		return nil
	})
}

// A runtime is started at the size the driver's Cores says (the policy's cores_per_runtime), as
// --cores and GOMAXPROCS; without it, at the runtime's default. Not parallel: it clears
// GOMAXPROCS in the environment the runtimes inherit.
func TestProcessDriverSizesRuntimes(t *testing.T) {
	dir := t.TempDir()
	bin, out := filepath.Join(dir, "fanin"), filepath.Join(dir, "started")
	script := "#!/bin/sh\necho \"$* GOMAXPROCS=$GOMAXPROCS\" >> " + out + "\ntrap 'exit 0' TERM\nwhile :; do sleep 0.05; done\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOMAXPROCS", "")
	cores := 2
	d := &autoscaler.ProcessDriver{Binary: bin, Args: []string{"--nats", "nats://x"}, Prefix: "rt", Grace: time.Second,
		Cores: func() int { return cores }}
	defer d.Close()
	ctx := context.Background()
	if err := d.Scale(ctx, 1); err != nil {
		t.Fatal(err)
	}
	var lines []string
	started := func(n int) { // wait for the first n runtimes' lines, in the order they started
		testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			b, _ := os.ReadFile(out)
			if lines = strings.Fields(strings.ReplaceAll(string(b), " ", "_")); len(lines) < n {
				return fmt.Errorf("%d of %d runtimes started", len(lines), n)
			}
			return nil
		})
		for i := range lines {
			lines[i] = strings.ReplaceAll(lines[i], "_", " ")
		}
	}
	started(1)
	cores = 0
	if err := d.Scale(ctx, 2); err != nil {
		t.Fatal(err)
	}
	started(2)
	sized := regexp.MustCompile(`^runtime --id rt-[0-9a-f]{12} --nats nats://x --cores 2 GOMAXPROCS=2$`)
	unsized := regexp.MustCompile(`^runtime --id rt-[0-9a-f]{12} --nats nats://x GOMAXPROCS=$`)
	if !sized.MatchString(lines[0]) {
		t.Errorf("first runtime started as %q, want --cores 2 and GOMAXPROCS=2", lines[0])
	}
	if !unsized.MatchString(lines[1]) {
		t.Errorf("second runtime started as %q, want no --cores and no GOMAXPROCS (cores 0)", lines[1])
	}
}
