package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/autoscaler/kubedriver"
	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/internal/telemetry"
	"github.com/fanin-ml/fanin/runtime"
)

type natsFlags struct {
	url   string
	creds string

	// local, if set, is a NATS server in this process (the runtime's --nats-config): connect
	// joins it in-process, not through url.
	local *server.Server
	// ordered: url lists the servers in the order to try them (the runtime's --nats-local first),
	// not shuffled as nats.go does by default.
	ordered bool

	nc   *nats.Conn // set by connect
	dial dialState
}

// register adds the flags to cmd and makes its errors say why NATS is out of reach, if it is
// (explain).
func (f *natsFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.url, "nats", envOr("NATS_URL", nats.DefaultURL), "NATS server URL (env NATS_URL)")
	cmd.Flags().StringVar(&f.creds, "creds", envOr("NATS_CREDS", ""), "NATS credentials file (env NATS_CREDS)")
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(c *cobra.Command, args []string) error { return f.explain(run(c, args)) }
	}
}

// connect connects to NATS, and keeps trying in the background if the server is not there yet
// (a Kubernetes pod may start before its NATS): every failed attempt is remembered, and logged
// when its cause changes.
func (f *natsFlags) connect(name string) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			slog.Error("NATS async error", "subject", subj, "err", err)
		}),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if !nc.IsClosed() { // not our own Close
				slog.Warn("disconnected from NATS; reconnecting", "err", err)
			}
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			switch err = dialCause(f.url, err); {
			case !f.dial.failed(err):
			case isAuthError(err):
				slog.Warn("NATS refused the connection's credentials; retrying", "url", redactURL(f.url), "err", err)
			default:
				slog.Warn("cannot reach NATS; retrying", "url", redactURL(f.url), "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			slog.Info("reconnected to NATS", "url", nc.ConnectedUrlRedacted())
		})}
	if f.creds != "" {
		opts = append(opts, nats.UserCredentials(f.creds))
	}
	if f.local != nil {
		opts = append(opts, nats.InProcessServer(f.local))
	}
	if f.ordered {
		opts = append(opts, nats.DontRandomize())
	}
	nc, err := nats.Connect(f.url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", f.url, err)
	}
	f.nc = nc
	return nc, nil
}

func runtimeCmd() *cobra.Command {
	var nf natsFlags
	var id, metricsAddr, metricsHost, node, nic, natsConfig, natsLocal string
	var cores int
	cmd := &cobra.Command{
		Use:   "runtime",
		Short: "Run one runtime: serve the shards placed on it",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if metricsAddr == "" && cmd.Flags().Changed("metrics-host") {
				return errors.New("--metrics-host names the host of the metrics URL, and --metrics (where it listens) is not set")
			}
			if natsConfig != "" && cmd.Flags().Changed("nats") {
				return errors.New("--nats-config runs this runtime's NATS server in its process, and --nats names another: give one")
			}
			if natsConfig != "" && natsLocal != "" {
				return errors.New("--nats-config runs this runtime's NATS server in its process, and --nats-local names another: give one")
			}
			bw, err := nicBandwidth(nic)
			if err != nil {
				return err
			}
			if natsLocal != "" {
				nf.url, nf.ordered = natsLocal+","+nf.url, true
			}
			if natsConfig != "" {
				ns, err := embed.FromFile(natsConfig)
				if err != nil {
					return err
				}
				// Deferred before the connection's Close: the runtime stops and closes its
				// connection first, then the server shuts down.
				defer func() {
					ns.Shutdown()
					ns.WaitForShutdown()
				}()
				nf.local, nf.url = ns, ns.ClientURL()
			}
			nc, err := nf.connect("fanin-runtime")
			if err != nil {
				return err
			}
			defer nc.Close()
			// Serve metrics first: the runtime registers their URL for service discovery.
			metricsURL, stop, err := serveMetrics(cmd.Context(), metricsAddr, metricsHost)
			if err != nil {
				return err
			}
			defer stop()
			// The process is this runtime's alone: its CPU per unit of work goes into the load
			// reports, and the autoscaler plans it.
			opts := []runtime.Option{runtime.WithLogger(slog.Default()), runtime.WithMetricsURL(metricsURL), runtime.WithProcessCPU(runtime.ProcessCPU)}
			if id != "" {
				opts = append(opts, runtime.WithID(id))
			}
			if cores > 0 {
				opts = append(opts, runtime.WithCores(cores))
			}
			opts = append(opts, runtime.WithNode(node), runtime.WithNICBandwidth(bw))
			rt, err := runtime.New(nc, opts...)
			if err != nil {
				return err
			}
			return rt.Run(cmd.Context())
		},
	}
	nf.register(cmd)
	metricsFlag(cmd, &metricsAddr)
	cmd.Flags().StringVar(&metricsHost, "metrics-host", envOr("FANIN_METRICS_HOST", ""),
		"the host name or address the runtime registers its metrics URL with, with --metrics's port (env FANIN_METRICS_HOST; default: --metrics's address, or this host's name when it listens on every address; on Kubernetes, the pod's IP)")
	cmd.Flags().StringVar(&id, "id", envOr("FANIN_RUNTIME_ID", ""), "runtime id (default: random)")
	cmd.Flags().IntVar(&cores, "cores", 0, "concurrent shard invocations and reported capacity (default: GOMAXPROCS)")
	cmd.Flags().StringVar(&node, "node", envOr("FANIN_NODE", ""),
		"the machine this runtime runs on: runtimes with one label share one NIC in the autoscaler's model (default: the NATS server's name)")
	cmd.Flags().StringVar(&natsConfig, "nats-config", envOr("FANIN_NATS_CONFIG", ""),
		"run a NATS server from this configuration file (nats-server's format: e.g. a member of the node's NATS cluster) in this process, and connect to it in-process rather than to --nats: the node's server and its runtime share a process, and no byte between them crosses the kernel (env FANIN_NATS_CONFIG)")
	cmd.Flags().StringVar(&natsLocal, "nats-local", envOr("FANIN_NATS_LOCAL", ""),
		"the NATS server of this runtime's own node, tried before --nats's servers (then those in their order, not shuffled): the runtime then serves the shards whose gradient streams are on its node without a network hop; on Kubernetes, a Service with internalTrafficPolicy: Local (env FANIN_NATS_LOCAL)")
	cmd.Flags().StringVar(&nic, "nic-bandwidth", envOr("FANIN_NIC_BANDWIDTH", "auto"),
		"the node's network bandwidth each way, e.g. 100Mbit, 10Gbit, 125MB; 0 is unknown (no limit); auto reads the default route's link speed")
	return cmd
}

// nicBandwidth is --nic-bandwidth in bytes per second; "auto" reads the link speed the kernel
// reports for the default route's interface (0 when it reports none).
func nicBandwidth(flag string) (float64, error) {
	if flag != "auto" {
		bw, err := runtime.ParseBandwidth(flag)
		if err != nil {
			return 0, fmt.Errorf("--nic-bandwidth: %w", err)
		}
		return bw, nil
	}
	dev, bw := runtime.LinkBandwidth(os.DirFS("/"))
	slog.Info("NIC bandwidth from the link speed", "interface", dev, "bits_per_sec", bw*8)
	return bw, nil
}

func gatewayCmd() *cobra.Command {
	var nf natsFlags
	var gf gatewayFlags // security and quotas (auth.go)
	var addr string
	var lim gateway.HTTPLimits
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run the HTTP API",
		RunE: func(cmd *cobra.Command, _ []string) error {
			gf.defaults(&nf)
			nc, err := nf.connect("fanin-gateway")
			if err != nil {
				return err
			}
			defer nc.Close()
			defer metrics.Default().WatchConn("gateway", nc)()
			opts, closeAuth, err := gf.options(nf.url)
			if err != nil {
				return err
			}
			defer closeAuth()
			gw, err := gateway.New(cmd.Context(), nc, append([]gateway.Option{gateway.WithLogger(slog.Default())}, opts...)...)
			if err != nil {
				return err
			}
			defer gw.Close()
			return serveHTTP(cmd.Context(), addr, metrics.Default().HTTP(telemetry.HTTPHandler(gw.Handler(), telemetry.Default())), lim)
		},
	}
	nf.register(cmd)
	cmd.Flags().StringVar(&addr, "http", envOr("FANIN_HTTP", "127.0.0.1:8080"), "listen address of the HTTP API")
	d := gateway.DefaultHTTPLimits
	cmd.Flags().DurationVar(&lim.ReadTimeout, "http-read-timeout", d.ReadTimeout, "longest time a client may take to send a request, body included")
	cmd.Flags().DurationVar(&lim.WriteTimeout, "http-write-timeout", d.WriteTimeout, "longest time to answer a request (more than the drain timeout)")
	cmd.Flags().DurationVar(&lim.IdleTimeout, "http-idle-timeout", d.IdleTimeout, "how long an idle keep-alive connection stays open")
	cmd.Flags().IntVar(&lim.MaxConns, "http-max-conns", d.MaxConns, "HTTP connections open at once; more wait to be accepted")
	gf.register(cmd)
	return cmd
}

func autoscalerCmd() *cobra.Command {
	var nf natsFlags
	var driver, policyFile, bin, metricsAddr string
	var kubeNamespace, kubeDeployment, kubeconfig string
	var runtimeMetrics, runtimeCreds, processDir string
	var interval time.Duration
	cmd := &cobra.Command{
		Use:   "autoscaler",
		Short: "Run the autoscaler: sizes the runtime pool and places shards (one leader among replicas)",
		Long: `The autoscaler decides, every interval, the pool size and where every shard runs, from the
runtimes' load reports. Run several for availability: a lock in JetStream elects one leader.

--driver none        only places shards on the runtimes that are there (someone else starts them)
--driver process     starts and stops 'fanin runtime' processes on this machine
--driver kubernetes  scales the Deployment --deployment in --namespace through the Kubernetes API
                     (docs/KUBERNETES.md); in-cluster credentials unless --kubeconfig or $KUBECONFIG

The policy is read from the fanin-policy bucket and followed live when it changes; --policy
stores a file there at start.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, err := nf.connect("fanin-autoscaler")
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx := cmd.Context()
			var opts []autoscaler.ControllerOption
			opts = append(opts, autoscaler.WithControllerLogger(slog.Default()), autoscaler.WithInterval(interval))
			if policyFile != "" {
				pol, err := storePolicyFile(ctx, nc, policyFile)
				if err != nil {
					return err
				}
				opts = append(opts, autoscaler.WithPolicy(pol))
			}
			var c *autoscaler.Controller
			var drv autoscaler.PoolDriver
			var kd *kubedriver.Driver
			switch driver {
			case "none":
			case "process":
				if bin == "" {
					if bin, err = os.Executable(); err != nil {
						return err
					}
				}
				args := []string{"--nats", nf.url}
				if runtimeCreds == "" && nf.creds != "" {
					// fanin auth init writes runtime.creds beside autoscaler.creds.
					if c := filepath.Join(filepath.Dir(nf.creds), "runtime.creds"); fileExists(c) {
						runtimeCreds = c
					} else {
						return fmt.Errorf("--driver process with --creds: give the runtimes their own credentials with --runtime-creds (runtime.creds of 'fanin auth init'); %s does not exist", c)
					}
				}
				if runtimeCreds != "" {
					args = append(args, "--creds", runtimeCreds)
				}
				if runtimeMetrics != "" {
					args = append(args, "--metrics", runtimeMetrics)
				}
				pd := &autoscaler.ProcessDriver{Binary: bin, Args: args, Prefix: "rt", Dir: processDir, Log: slog.Default(),
					OnVanished: func(id string) { c.Vanished(id) },
					Cores:      func() int { return c.Policy().CoresPerRuntime }}
				defer pd.Close()
				drv = pd
			case "kubernetes":
				cs, ns, err := kubedriver.Client(kubeconfig)
				if err != nil {
					return err
				}
				if kubeNamespace != "" {
					ns = kubeNamespace
				}
				if kd, err = kubedriver.New(ctx, cs, ns, kubeDeployment,
					kubedriver.WithLogger(slog.Default())); err != nil {
					return err
				}
				drv = kd
			default:
				return fmt.Errorf("--driver: %q is not none, process or kubernetes", driver)
			}
			if c, err = autoscaler.NewController(nc, drv, opts...); err != nil {
				return err
			}
			if kd != nil { // pods that die unasked are deregistered at once, as with the process driver
				w, err := kd.WatchVanished(ctx, c.Vanished)
				if err != nil {
					return err
				}
				defer w.Stop()
			}
			_, stop, err := serveMetrics(ctx, metricsAddr, "")
			if err != nil {
				return err
			}
			defer stop()
			return c.Run(ctx)
		},
	}
	nf.register(cmd)
	cmd.Flags().StringVar(&driver, "driver", "none", "pool driver: none, process or kubernetes")
	cmd.Flags().StringVar(&kubeNamespace, "namespace", "", "kubernetes driver: namespace of the runtime Deployment (default: the kubeconfig context's, or the pod's)")
	cmd.Flags().StringVar(&kubeDeployment, "deployment", "fanin-runtime", "kubernetes driver: the runtime Deployment")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubernetes driver: kubeconfig file (default: $KUBECONFIG, else in-cluster)")
	cmd.Flags().StringVar(&runtimeCreds, "runtime-creds", envOr("FANIN_RUNTIME_CREDS", ""), "process driver: NATS credentials of the runtimes it starts (env FANIN_RUNTIME_CREDS; default: runtime.creds beside --creds)")
	cmd.Flags().StringVar(&processDir, "process-dir", envOr("FANIN_PROCESS_DIR", ""), "process driver: a directory of its own where it records its runtimes' pids, so that a restarted autoscaler stops those a crashed one left (env FANIN_PROCESS_DIR; on Linux runtimes also stop when their autoscaler dies)")
	cmd.Flags().StringVar(&bin, "runtime-binary", "", "fanin binary the process driver starts (default: this one)")
	cmd.Flags().StringVar(&runtimeMetrics, "runtime-metrics", "127.0.0.1:0", "process driver: the --metrics address of the runtimes it starts (port 0: any free port; Prometheus finds them through the gateway's GET /v1/metrics/targets); empty: none")
	cmd.Flags().StringVar(&policyFile, "policy", "", "store this policy file (YAML or JSON) in the fanin-policy bucket at start")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "decision interval")
	metricsFlag(cmd, &metricsAddr)
	return cmd
}

// storePolicyFile validates a policy file and stores it in the policy bucket.
func storePolicyFile(ctx context.Context, nc *nats.Conn, path string) (autoscaler.Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return autoscaler.Policy{}, err
	}
	pol, err := autoscaler.ParsePolicy(data)
	if err != nil {
		return autoscaler.Policy{}, fmt.Errorf("%s: %w", path, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return pol, err
	}
	b, err := store.OpenBuckets(ctx, js)
	if err != nil {
		return pol, err
	}
	if _, err := b.Policy.Put(ctx, autoscaler.PolicyKey, []byte(pol.YAML())); err != nil {
		return pol, fmt.Errorf("store the policy: %w", err)
	}
	return pol, nil
}

func metricsFlag(cmd *cobra.Command, addr *string) {
	cmd.Flags().StringVar(addr, "metrics", envOr("FANIN_METRICS", ""),
		"listen address of a Prometheus /metrics endpoint, e.g. 127.0.0.1:9464 (env FANIN_METRICS; default: none)")
}

// serveMetrics serves the process's metrics at http://addr/metrics until ctx is done or stop is
// called; stop returns once the server is down. An empty addr serves nothing. The URL it returns
// names a wildcard address by host, or by this host's name if host is "".
func serveMetrics(ctx context.Context, addr, host string) (url string, stop func(), err error) {
	if addr == "" {
		return "", func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--metrics: %w", err)
	}
	url = "http://" + reachable(ln.Addr().(*net.TCPAddr), host) + "/metrics"
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	slog.Info("metrics listening", "url", url)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { // owned by stop
		defer close(done)
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(ln) }()
		select {
		case err := <-errc:
			slog.Error("metrics endpoint", "err", err)
		case <-ctx.Done():
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = srv.Shutdown(sctx)
			scancel()
			<-errc
		}
	}()
	return url, func() { cancel(); <-done }, nil
}

// reachable names a listening address as others can dial it: by host at its port when host is
// set (a NAT, a service name); else a wildcard address (":9090") by this host's name.
func reachable(a *net.TCPAddr, host string) string {
	if host == "" && a.IP.IsUnspecified() {
		host, _ = os.Hostname()
	}
	if host != "" {
		return net.JoinHostPort(host, strconv.Itoa(a.Port))
	}
	return a.String()
}

func serveHTTP(ctx context.Context, addr string, h http.Handler, lim gateway.HTTPLimits) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv, ln := gateway.HTTPServer(h, ln, lim)
	slog.Info("HTTP API listening", "url", "http://"+ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
