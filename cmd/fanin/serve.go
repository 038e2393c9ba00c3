package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/runtime"
)

type natsFlags struct {
	url   string
	creds string
}

func (f *natsFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.url, "nats", envOr("NATS_URL", nats.DefaultURL), "NATS server URL (env NATS_URL)")
	cmd.Flags().StringVar(&f.creds, "creds", envOr("NATS_CREDS", ""), "NATS credentials file (env NATS_CREDS)")
}

func (f *natsFlags) connect(name string) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			slog.Error("NATS async error", "subject", subj, "err", err)
		})}
	if f.creds != "" {
		opts = append(opts, nats.UserCredentials(f.creds))
	}
	nc, err := nats.Connect(f.url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", f.url, err)
	}
	return nc, nil
}

func runtimeCmd() *cobra.Command {
	var nf natsFlags
	var id string
	var cores int
	cmd := &cobra.Command{
		Use:   "runtime",
		Short: "Run one runtime: serve the shards placed on it",
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, err := nf.connect("fanin-runtime")
			if err != nil {
				return err
			}
			defer nc.Close()
			opts := []runtime.Option{runtime.WithLogger(slog.Default())}
			if id != "" {
				opts = append(opts, runtime.WithID(id))
			}
			if cores > 0 {
				opts = append(opts, runtime.WithCores(cores))
			}
			rt, err := runtime.New(nc, opts...)
			if err != nil {
				return err
			}
			return rt.Run(cmd.Context())
		},
	}
	nf.register(cmd)
	cmd.Flags().StringVar(&id, "id", envOr("FANIN_RUNTIME_ID", ""), "runtime id (default: random)")
	cmd.Flags().IntVar(&cores, "cores", 0, "concurrent shard invocations and reported capacity (default: GOMAXPROCS)")
	return cmd
}

func gatewayCmd() *cobra.Command {
	var nf natsFlags
	var addr string
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run the HTTP API",
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, err := nf.connect("fanin-gateway")
			if err != nil {
				return err
			}
			defer nc.Close()
			gw, err := gateway.New(cmd.Context(), nc, gateway.WithLogger(slog.Default()))
			if err != nil {
				return err
			}
			return serveHTTP(cmd.Context(), addr, gw.Handler())
		},
	}
	nf.register(cmd)
	cmd.Flags().StringVar(&addr, "http", envOr("FANIN_HTTP", "127.0.0.1:8080"), "listen address of the HTTP API")
	return cmd
}

func autoscalerCmd() *cobra.Command {
	var nf natsFlags
	cmd := &cobra.Command{
		Use:   "autoscaler",
		Short: "Run the placer, the single writer of shard placement (static for now)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, err := nf.connect("fanin-autoscaler")
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			return autoscaler.NewStaticPlacer(js, slog.Default()).Run(cmd.Context())
		},
	}
	nf.register(cmd)
	return cmd
}

func serveHTTP(ctx context.Context, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
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
