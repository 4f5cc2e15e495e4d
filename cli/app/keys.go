package app

import (
	"bytes"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// maxLegacySecretBytes bounds what wrap-hmac reads.
const maxLegacySecretBytes = 64 << 10

func newKeysCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Inspect allocation key files",
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "id FILE...",
		Short: "Print the ID of each key in the files, as signatures name them",
		Long: `Print ALGORITHM:KEYID and the kind of each key in the allocation key files,
the IDs signatures name ("ed25519:KEYID:..."): compare the scheduler's key
with the nodes' before switching keys.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, files []string) error {
			for _, f := range files {
				data, err := readBounded(f)
				if err != nil {
					return err
				}
				keys, err := kubeinterface.ParseKeys(data)
				if err != nil {
					return fmt.Errorf("%s: %w", f, err)
				}
				for _, k := range keys {
					kind := "public key (verifies)"
					switch {
					case k.Algorithm() == kubeinterface.AlgHMACSHA256:
						kind = "shared HMAC secret (signs and verifies: any holder can mint allocations)"
					case k.CanSign():
						kind = "private key (signs)"
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s:%s\t%s\n", f, k.Algorithm(), k.ID(), kind)
				}
			}
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "wrap-hmac FILE",
		Short: "Print an earlier version's bare HMAC secret file as a PEM key file",
		Long: `Print the PEM key file ("KUBEGPU HMAC-SHA256 SECRET") holding the same secret
as FILE, a bare secret as earlier versions read it (the file's bytes with
surrounding white space removed), so that allocations signed with it stay
valid. Its key ID goes to standard error. Better: move to Ed25519.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := readBounded(args[0])
			if err != nil {
				return err
			}
			secret := bytes.TrimSpace(data)
			if bytes.Contains(secret, []byte("-----BEGIN")) {
				return fmt.Errorf("%s is already a PEM file", args[0])
			}
			k, err := kubeinterface.NewHMACKey(secret)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			if _, err := cmd.OutOrStdout().Write(kubeinterface.EncodeHMACSecret(secret)); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "key ID %s:%s\n", k.Algorithm(), k.ID())
			return nil
		},
	})
	return cmd
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxLegacySecretBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxLegacySecretBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes, not a key file", path, maxLegacySecretBytes)
	}
	return data, nil
}
