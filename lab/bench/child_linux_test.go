package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/lab/testutil"
)

// A child the bench started dies with the bench: a helper process (this test binary) starts one
// through command, prints its pid and is killed; the child must be gone.
func TestChildDiesWithBench(t *testing.T) {
	if os.Getenv("FANIN_BENCH_CHILD_HELPER") != "" {
		child := command(context.Background(), "sleep", "600")
		if err := child.Start(); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(child.Process.Pid)
		select {} // until killed
	}
	t.Parallel()
	helper := exec.Command(os.Args[0], "-test.run=^TestChildDiesWithBench$")
	helper.Env = append(os.Environ(), "FANIN_BENCH_CHILD_HELPER=1")
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(line[:len(line)-1])
	if err != nil {
		t.Fatalf("the helper said %q", line)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the child %d is not running: %v", pid, err)
	}
	_ = helper.Process.Kill()
	_ = helper.Wait()
	testutil.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		// Gone, or a zombie its new parent has not reaped yet.
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return nil
		}
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && zombie(st) {
			return nil
		}
		return fmt.Errorf("the child %d outlived the bench that started it", pid)
	})
}

// zombie reports whether /proc/<pid>/stat's text says the process has exited.
func zombie(stat []byte) bool {
	for i := len(stat) - 1; i > 0; i-- { // the state follows the command's closing parenthesis
		if stat[i] == ')' {
			return i+2 < len(stat) && stat[i+2] == 'Z'
		}
	}
	return false
}
