package functions

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// TestUnderQemu runs this package's bit-exactness tests (the golden hashes, the kernels against
// the scalar definition, the functions) compiled for other architectures under qemu-user: arm64,
// ppc64le, riscv64 (whose Go compilers fuse x*y+z into an FMA unless a float32(...) conversion
// forbids it) and s390x (big-endian). It needs FANIN_QEMU=1 and qemu-user
// (apt-get install qemu-user), takes about a minute, and fails if any of them fails:
//
//	FANIN_QEMU=1 go test -run TestUnderQemu -v ./functions
func TestUnderQemu(t *testing.T) {
	t.Parallel()
	if os.Getenv("FANIN_QEMU") == "" {
		t.Skip("set FANIN_QEMU=1 to run the bit-exactness tests under qemu-user on arm64, ppc64le, riscv64 and s390x")
	}
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	for _, a := range []struct{ goarch, qemu string }{
		{"arm64", "qemu-aarch64"}, {"ppc64le", "qemu-ppc64le"}, {"riscv64", "qemu-riscv64"}, {"s390x", "qemu-s390x"},
	} {
		t.Run(a.goarch, func(t *testing.T) {
			t.Parallel() // each is a compile and then one emulated process: two cores overlap them
			q, err := exec.LookPath(a.qemu)
			if err != nil {
				t.Fatalf("%s not found (apt-get install qemu-user): %v", a.qemu, err)
			}
			bin := filepath.Join(t.TempDir(), "functions.test")
			build := exec.Command(goTool, "test", "-c", "-o", bin, ".")
			build.Env = append(os.Environ(), "GOARCH="+a.goarch, "CGO_ENABLED=0")
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go test -c for %s: %v\n%s", a.goarch, err, out)
			}
			run := exec.Command(q, bin, "-test.count=1",
				"-test.run", "^(TestGolden|TestFold.*|TestWeightedFold.*|TestSumLE|TestSumLE16.*|TestAddLE16.*|TestKernels.*|TestByteSum.*|TestHandComputed|TestRounded|TestAdam.*|TestClip|TestReference.*)$")
			if out, err := run.CombinedOutput(); err != nil {
				t.Fatalf("%s under %s: %v\n%s", a.goarch, a.qemu, err, out)
			}
		})
	}
}
