// Command fanin runs fanin: everything at once on an embedded NATS server (`fanin dev`), or one part
// against an external NATS (`fanin runtime|gateway|autoscaler`), and talks to a running one.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/attribute"

	"github.com/fanin-ml/fanin/internal/telemetry/otlp"
)

// version is stamped at build time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fanin:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	root, stopTracing := rootCmd()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := (*stopTracing)(sctx); serr != nil {
		slog.Warn("flushing traces", "err", serr)
	}
	return err
}

// rootCmd builds the command tree; once a command has run, *stopTracing flushes its traces.
func rootCmd() (_ *cobra.Command, stopTracing *func(context.Context) error) {
	root := &cobra.Command{
		Use:           "fanin",
		Short:         "fanin: an elastic aggregation service for distributed deep learning",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       versionLine(),
	}
	root.SetVersionTemplate("{{.Version}}\n") // the same line as `fanin version`
	var level string
	root.PersistentFlags().StringVar(&level, "log-level", envOr("FANIN_LOG_LEVEL", "info"), "log level: debug, info, warn, error")
	stop := func(context.Context) error { return nil }
	stopTracing = &stop
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		var l slog.Level
		if err := l.UnmarshalText([]byte(level)); err != nil {
			return fmt.Errorf("--log-level: %q is not debug, info, warn or error", level)
		}
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})))
		// Tracing as the OTEL_* variables say (docs/TELEMETRY.md); off without them.
		stop, err := otlp.Setup(cmd.Context(), otlp.WithService("fanin-"+cmd.Name()),
			otlp.WithAttributes(attribute.String("service.version", version)))
		if err != nil {
			return err
		}
		*stopTracing = stop
		return nil
	}
	root.AddCommand(devCmd(), runtimeCmd(), gatewayCmd(), autoscalerCmd(), jobsCmd(), simCmd(), benchCmd(), benchWorkersCmd(), benchRuntimeCmd(), benchNATSCmd(), benchElasticWorkerCmd(), poolCmd(), policyCmd(), topCmd(), tokensCmd(), functionsCmd(), authCmd(), natsCmd(), versionCmd())
	return root, stopTracing
}

func envOr(key, def string) string {
	if v := strings.TrimSpace(os.Getenv(key)); v != "" {
		return v
	}
	return def
}
