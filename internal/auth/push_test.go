package auth_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// Once PushAccountJWT returns, every server of a cluster has stored the job's account, and once
// LoadAccount returns every one has loaded it, so that clients that do not retry (one written from
// docs/PROTOCOL.md in another language), connecting at once to any server, reach the job's
// subjects the first time: nothing is left for their handshakes to fetch from a peer or to load
// concurrently. Not parallel: its servers listen on ports FreePort found free, which a test
// beside it could take first.
func TestPushedAccountIsLiveOnEveryServer(t *testing.T) {
	a, err := auth.New()
	if err != nil {
		t.Fatal(err)
	}
	opts := testutil.ClusterOptions(t, 3)
	for _, o := range opts {
		if err := a.ConfigureServer(o); err != nil {
			t.Fatal(err)
		}
	}
	cl := testutil.StartClusterOf(t, opts)
	url := func(i int) string { return cl.Node(i).ClientURL() }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	comp, err := a.ComponentCredentials("test-admin")
	if err != nil {
		t.Fatal(err)
	}
	admin := connect(t, url(0), comp, &errRecorder{})
	js, _ := jetstream.New(admin)
	sysCreds, _ := a.SystemCredentials("test-sys")
	sys := connect(t, url(0), sysCreds, &errRecorder{})
	// Right after the cluster forms, JetStream may not be enabled for the account on every server
	// yet ("jetstream not enabled for account", seen under the race detector): the components
	// create their buckets again until it is (docs/FAULTS.md), and so does the test.
	var kv jetstream.KeyValue
	testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() (err error) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.JobsBucket, Storage: jetstream.MemoryStorage})
		return err
	})
	for j := range 3 {
		id := fmt.Sprintf("fresh%d", j)
		acc := jobStreams(t, a, js, kv, sys, id) // pushes the account, as the gateway does
		key, _ := a.JobAccountKey(acc)
		for i, o := range opts {
			if _, err := os.Stat(filepath.Join(o.StoreDir, auth.ResolverDir, key+".jwt")); err != nil {
				t.Errorf("job %s: server %s has not stored the job's account when the push returns: %v", id, cl.Node(i).Name(), err)
			}
		}
		if err := auth.LoadAccount(ctx, sys, key); err != nil {
			t.Fatal(err)
		}
		for i := range opts {
			az, err := cl.Node(i).Accountz(&server.AccountzOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(az.Accounts, key) {
				t.Errorf("job %s: server %s has not loaded the job's account", id, cl.Node(i).Name())
			}
		}
		creds, err := a.JobCredentials(acc, 0)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range 3 * len(opts) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := firstTime(url(i%len(opts)), id, creds); err != nil {
					t.Errorf("job %s, client %d on server %s: %v", id, i, cl.Node(i%len(opts)).Name(), err)
				}
			}()
		}
		wg.Wait()
	}
}

// firstTime connects as a client that does not retry would, subscribes to the job's parameters,
// and reads its record and a shard's parameters, each once.
func firstTime(url, id string, c auth.Credentials) error {
	nc, err := testutil.ConnectOnce(url, id, c.JWT, c.Seed, c.InboxPrefix)
	if err != nil {
		return err
	}
	defer nc.Close()
	m, err := nc.Request(wire.DirectGetLast(wire.ParamsStream(id), wire.ParamsSubject(id, 0)), nil, 2*time.Second)
	if err != nil {
		return fmt.Errorf("read shard 0's parameters: %w", err)
	}
	if string(m.Data) != "params of "+id {
		return fmt.Errorf("read shard 0's parameters: %q", m.Data)
	}
	return nil
}
