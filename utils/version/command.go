package version

import (
	"fmt"

	"github.com/spf13/cobra"
)

// NewCommand returns a "version" subcommand that prints binary's name and
// Get().
func NewCommand(binary string) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), binary, Get())
			return err
		},
	}
}
