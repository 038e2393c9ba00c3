package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/gateway/api"
)

// functionsCmd is `fanin functions push|ls|rm`: user functions as WebAssembly modules
// (docs/FUNCTIONS.md). It speaks HTTP itself, so the SDK stays a worker's library.
func functionsCmd() *cobra.Command {
	var f apiFlags
	cmd := &cobra.Command{Use: "functions", Short: "Upload, list and delete user aggregation functions (WebAssembly modules)"}
	f.register(cmd)
	var name, owner string
	var version int
	push := &cobra.Command{
		Use: "push MODULE.wasm --name NAME --version N", Short: "Upload a module as <team>/NAME@N (versions are never replaced)",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			code, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			if name == "" {
				name = strings.TrimSuffix(filepath.Base(args[0]), filepath.Ext(args[0]))
			}
			q := url.Values{"name": {name}, "version": {strconv.Itoa(version)}}
			if owner != "" {
				q.Set("owner", owner)
			}
			var out struct {
				Function string `json:"function"`
				Digest   string `json:"digest"`
				Size     int    `json:"size"`
				Created  bool   `json:"created"`
				Info     struct {
					Doc   string   `json:"doc"`
					State []string `json:"state"`
					Hyper []struct {
						Name     string  `json:"name"`
						Default  float64 `json:"default"`
						Required bool    `json:"required"`
						Range    string  `json:"range"`
					} `json:"hyper"`
				} `json:"info"`
			}
			raw, err := f.call(cmd.Context(), "POST", "/v1/functions?"+q.Encode(), "application/wasm", code, &out)
			if err != nil {
				return err
			}
			if f.output == "json" {
				_, err := cmd.OutOrStdout().Write(raw)
				return err
			}
			verb := "uploaded"
			if !out.Created {
				verb = "already there"
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%s: %s (%s, sha256 %s)\n", verb, out.Function, human(float64(out.Size)), out.Digest)
			fmt.Fprintf(w, "  %s\n  state vectors: %v\n", out.Info.Doc, out.Info.State)
			for _, h := range out.Info.Hyper {
				def := strconv.FormatFloat(h.Default, 'g', -1, 64)
				if h.Required {
					def = "required"
				}
				fmt.Fprintf(w, "  hyper %s: %s, range %q\n", h.Name, def, h.Range)
			}
			fmt.Fprintf(w, "a job names it: function: {name: %s, hyper: {...}}\n", out.Function)
			return nil
		},
	}
	push.Flags().StringVar(&name, "name", "", "the function's name (default: the file's name without .wasm)")
	push.Flags().IntVar(&version, "version", 1, "its version, from 1")
	push.Flags().StringVar(&owner, "owner", "", "admin only: the team that owns it")
	ls := &cobra.Command{
		Use: "ls", Short: "List the built-in functions and the user functions the token reaches", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var out struct {
				Functions []struct {
					Name string `json:"name"`
					Doc  string `json:"doc"`
				} `json:"functions"`
				Modules []struct {
					Owner   string    `json:"owner"`
					Name    string    `json:"name"`
					Version int       `json:"version"`
					Digest  string    `json:"digest"`
					Size    int       `json:"size"`
					Created time.Time `json:"created"`
				} `json:"modules"`
			}
			raw, err := f.call(cmd.Context(), "GET", "/v1/functions", "", nil, &out)
			if err != nil {
				return err
			}
			if f.output == "json" {
				_, err := cmd.OutOrStdout().Write(raw)
				return err
			}
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintln(tw, "FUNCTION\tKIND\tSHA256\tSIZE\tCREATED")
			for _, b := range out.Functions {
				fmt.Fprintf(tw, "%s\tbuilt-in\t-\t-\t-\n", b.Name)
			}
			for _, m := range out.Modules {
				fmt.Fprintf(tw, "%s/%s@%d\twasm\t%s\t%s\t%s\n", m.Owner, m.Name, m.Version, m.Digest[:12], human(float64(m.Size)),
					m.Created.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use: "rm OWNER/NAME@VERSION...", Short: "Delete user functions (refused while a job uses one)", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, ref := range args {
				if _, err := f.call(cmd.Context(), "DELETE", "/v1/functions/"+ref, "", nil, nil); err != nil {
					return fmt.Errorf("%s: %w", ref, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), "deleted", ref)
			}
			return nil
		},
	}
	cmd.AddCommand(push, ls, rm)
	return f.checked(cmd)
}

// call makes one API request and decodes a 2xx answer into out (if not nil); an error answer
// becomes an error with the problem's code and detail.
func (f *apiFlags) call(ctx context.Context, method, path, ctype string, body []byte, out any) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(f.api, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if tok := f.resolveToken(); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		var p api.Problem
		if json.Unmarshal(raw, &p) == nil && p.Code != "" {
			return nil, fmt.Errorf("%s (%d): %s", p.Code, resp.StatusCode, p.Detail)
		}
		return nil, fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return raw, nil
}
