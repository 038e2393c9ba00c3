package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsMonitor is the NATS server in a runtime's process: its client URL and its monitoring
// endpoint, where the bench reads the bytes it counted.
type natsMonitor struct{ client, http string }

func (m natsMonitor) varz(ctx context.Context) (server.Varz, error) {
	var v server.Varz
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.http+"/varz", nil)
	if err != nil {
		return v, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("GET %s/varz: %s", m.http, resp.Status)
	}
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

// startEmbeddedRuntimes starts n runtime processes, rt-0 to rt-(n-1), each running a NATS server
// of its own in its process (`fanin runtime --nats-config`), the n servers one cluster over
// loopback, configured as the embedded server of `fanin dev` is for fanin's traffic. It returns
// once their JetStream answers; the processes are added to procs as they start.
func startEmbeddedRuntimes(ctx context.Context, exe, dir string, n int, procs *[]*runtimeProc) ([]natsMonitor, error) {
	ports := make([]int, 3*n) // client, route and monitoring port of each server
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[3*i+1]))
	}
	var servers []natsMonitor
	for i := range n {
		id := fmt.Sprintf("rt-%d", i)
		conf := fmt.Sprintf("server_name: %s\nlisten: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\nmax_payload: %d\nmax_pending: 1GB\nwrite_deadline: \"10s\"\n"+
			"jetstream { store_dir: %q, max_buffered_size: 1GB }\n",
			id, ports[3*i], ports[3*i+2], 32<<20, filepath.Join(dir, id))
		if n > 1 {
			conf += fmt.Sprintf("cluster { name: fanin-cost, listen: 127.0.0.1:%d, routes: [%s] }\n", ports[3*i+1], strings.Join(routes, ", "))
		}
		path := filepath.Join(dir, id+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			return nil, err
		}
		args := []string{RuntimeCommand, "--nats-config", path, "--id", id, "--cores", strconv.Itoa(runtimeCores)}
		p, err := startRuntimeCmd(id, command(ctx, exe, args...), nil)
		if err != nil {
			return nil, err
		}
		*procs = append(*procs, p)
		servers = append(servers, natsMonitor{client: fmt.Sprintf("nats://127.0.0.1:%d", ports[3*i]), http: fmt.Sprintf("http://127.0.0.1:%d", ports[3*i+2])})
	}
	for _, s := range servers {
		if err := waitFor(ctx, time.Minute, func() error {
			nc, err := nats.Connect(s.client)
			if err != nil {
				return err
			}
			defer nc.Close()
			return jetStreamAnswers(ctx, nc)
		}); err != nil {
			return nil, fmt.Errorf("the NATS server of a runtime at %s: %w", s.client, err)
		}
	}
	return servers, nil
}

// jetStreamAnswers is nil once JetStream answers on nc: on a cluster, once its servers elected a
// meta leader.
func jetStreamAnswers(ctx context.Context, nc *nats.Conn) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}
