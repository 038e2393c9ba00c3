package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/sdk"
)

// apiFlags are the flags of every client command: where the gateway is, the token, the output.
type apiFlags struct {
	api, token, output string
}

// register adds the flags to cmd (persistent: its subcommands have them).
func (f *apiFlags) register(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&f.api, "api", envOr("FANIN_API", "http://127.0.0.1:8080"), "gateway URL (env FANIN_API)")
	cmd.PersistentFlags().StringVar(&f.token, "token", "", "API token (env FANIN_TOKEN; against a local 'fanin dev', its admin token by default)")
	cmd.PersistentFlags().StringVarP(&f.output, "output", "o", "table", "output: table or json")
}

// checked makes every command of the tree under cmd check -o before it runs, and say so when no
// gateway answers at --api; call it once the tree is built. (A PersistentPreRunE would replace the root's, which sets up logging.)
func (f *apiFlags) checked(cmd *cobra.Command) *cobra.Command {
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(c *cobra.Command, args []string) error {
			if err := f.checkOutput(); err != nil {
				return err
			}
			return f.explainAPI(run(c, args))
		}
	}
	for _, sub := range cmd.Commands() {
		f.checked(sub)
	}
	return cmd
}

// admin is the API client: the token from --token, FANIN_TOKEN, or, for a gateway on this
// machine, the admin token `fanin dev` keeps in its default data directory.
func (f *apiFlags) admin() *sdk.Admin {
	return sdk.NewAdmin(f.api, sdk.WithToken(f.resolveToken()))
}

func (f *apiFlags) resolveToken() string {
	if f.token != "" {
		return f.token
	}
	if t := envOr("FANIN_TOKEN", ""); t != "" {
		return t
	}
	if u, err := url.Parse(f.api); err == nil {
		if ip := net.ParseIP(u.Hostname()); (ip != nil && ip.IsLoopback()) || u.Hostname() == "localhost" {
			if b, err := os.ReadFile(auth.AdminTokenFile(devAuthDir(defaultDataDir()))); err == nil {
				return strings.TrimSpace(string(b))
			}
		}
	}
	return ""
}

func (f *apiFlags) checkOutput() error {
	if f.output != "table" && f.output != "json" {
		return fmt.Errorf("-o %q: use table or json", f.output)
	}
	return nil
}

// devAuthDir is where `fanin dev` keeps its keys and admin token.
func devAuthDir(dataDir string) string { return filepath.Join(dataDir, "auth") }

// readFileArg reads the file named by a -f flag; "-" reads the command's standard input.
func readFileArg(cmd *cobra.Command, name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(cmd.InOrStdin())
	}
	return os.ReadFile(name)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// human formats a byte count.
func human(b float64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1fGiB", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1fMiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1fKiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0fB", b)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func stepText(step int64) string {
	if step < 0 {
		return "?"
	}
	return fmt.Sprint(step)
}
