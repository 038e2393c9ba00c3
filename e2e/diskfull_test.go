package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// smallDisk mounts a tmpfs of size bytes for the test and returns its path; the test is skipped
// where it cannot mount one (not root, no mount namespace rights).
func smallDisk(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.Itoa(size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small disk (tmpfs needs root): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillDisk writes into dir until the disk is full and returns the file it wrote.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill the disk: %v", err)
			}
			return path
		}
	}
}

var storeFailed = regexp.MustCompile(`no space left on device`)

// TestFaultsDiskFull fills the disk of a nats-server's store while a file-storage job trains:
// the server fails the writes of the step in progress and acknowledges none of them. Once space
// is freed, the documented step (restart the server; it does not recover a stream whose write
// failed by itself) brings training back with nothing else done by hand: every step bit-exact,
// the stored parameters at the exact step count.
func TestFaultsDiskFull(t *testing.T) {
	skipShort(t)
	disk := smallDisk(t, 96<<20)
	nn := startNATSIn(t, 1, disk)
	f := startFanin(t, nn, 1)
	tt := f.train(clusterSpec("diskfull", "momentum"))
	tt.run(8)
	var full, freed time.Time
	tt.inStep = func(step int64) {
		if step != 9 {
			return
		}
		filler := fillDisk(t, disk)
		full = time.Now()
		nn.procs[0].p.waitFor(t, storeFailed, 60*time.Second)
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		freed = time.Now()
		nn.stop(0)
		nn.restart(0)
	}
	tt.run(20)
	tt.checkUpdates(nn.url())
	t.Logf("%d steps bit-exact across a full disk: the server reported its failed write %v after the disk filled; longest gap once space was freed and the server restarted: %v",
		tt.step, freed.Sub(full).Round(time.Millisecond), tt.longestGapSince(freed).Round(time.Millisecond))
	f.afterFaults("after-diskfull")
}
