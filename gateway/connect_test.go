package gateway_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/lab/testutil"
)

// When POST /v1/jobs returns, the NATS server has loaded the job's account, and clients that do
// not retry (one written from docs/PROTOCOL.md in another language), several connecting at once,
// read the job's record and subscribe to its parameters the first time.
func TestConnectRightAfterCreate(t *testing.T) {
	t.Parallel()
	st := authStack(t, 0)
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}
	const conns = 4
	for j := range 3 {
		id := fmt.Sprintf("fresh%d", j)
		var created api.JobCreated
		c.call("POST", "/v1/jobs", "application/json", specJSON(smallSpec(id)), 201, &created)
		key, err := st.Authority.JobAccountKey(auth.JobAccount{Job: id, Created: created.Created, Ranks: created.Spec.Ranks})
		if err != nil {
			t.Fatal(err)
		}
		az, err := st.NATS.Accountz(&server.AccountzOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(az.Accounts, key) {
			t.Fatalf("job %s: the server has not loaded the job's account when the create returns", id)
		}
		var wg sync.WaitGroup
		errs := make(chan error, conns)
		for i := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := connectOnce(st.URL, id, created.Credentials); err != nil {
					errs <- fmt.Errorf("job %s, client %d: %w", id, i, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
}

// connectOnce connects as a client that does not retry would, subscribes to the job's parameters
// and reads its record, each once.
func connectOnce(url, id string, c *api.Credentials) error {
	nc, err := testutil.ConnectOnce(url, id, c.JWT, c.Seed, c.InboxPrefix)
	if err != nil {
		return err
	}
	nc.Close()
	return nil
}
