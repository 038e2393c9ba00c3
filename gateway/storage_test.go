package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// TestSmallStore runs fanin on a NATS server whose JetStream may keep 40 MiB on disk (a small
// disk: the server's default max_store is 75% of the free space): fanin starts, with a shorter
// log of rejected inputs; a job whose streams need more than is left is refused with 507
// storage_full and what it needed; a job that fits trains.
func TestSmallStore(t *testing.T) {
	t.Parallel()
	st, err := devstack.Start(context.Background(), devstack.Config{
		DataDir: t.TempDir(), MaxStore: 40 << 20, NATSPort: -1, HTTPAddr: "127.0.0.1:0", Runtimes: 1,
		Logger: testutil.Logger(),
	})
	if err != nil {
		t.Fatalf("fanin does not start on a 40 MiB store: %v", err)
	}
	t.Cleanup(st.Close)
	nc, err := st.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	rejects, err := js.Stream(context.Background(), gateway.RejectsStream)
	if err != nil {
		t.Fatal(err)
	}
	if got := rejects.CachedInfo().Config.MaxBytes; got >= 40<<20 || got < 4<<20 {
		t.Errorf("the rejects log reserves %d bytes of a 40 MiB store", got)
	}

	c := client{t: t, base: st.HTTPURL}
	big := `{"id":"big","tensors":[{"name":"w","shape":[262144]}],"ranks":4,"function":{"name":"sum"},` +
		`"init":{"kind":"zeros"},"shard_size":"1MiB","storage":"file"}`
	status, _, body := c.do(http.MethodPost, "/v1/jobs", "application/json", big)
	var p api.Problem
	_ = json.Unmarshal(body, &p)
	if status != http.StatusInsufficientStorage || p.Code != string(wire.ReasonStorageFull) ||
		!strings.Contains(p.Detail, "KiB for gradients") {
		t.Fatalf("a job beyond the store: %d %s", status, body)
	}
	if _, err := js.Stream(context.Background(), wire.GradStream("big")); err == nil {
		t.Error("the refused job left its gradient stream behind")
	}

	rec, err := st.Gateway.CreateJob(context.Background(), job.Spec{
		ID: "small", Tensors: []job.Tensor{{Name: "w", Shape: []int{1024}}}, Ranks: 2,
		Function: job.Function{Name: "sum"}, Init: job.Init{Kind: "zeros"}, ShardSize: 4 << 10, Storage: "file",
	})
	if err != nil {
		t.Fatalf("a job that fits: %v", err)
	}
	testutil.Train(t, st.URL, rec, 5)
}
