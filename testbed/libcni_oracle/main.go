// libcni-oracle prints the CNI network config file a runtime built on libcni would load from a
// conf dir: the first of libcni.ConfFiles (sorted by name; .conf, .conflist, .json) that loads
// as a list with at least one plugin, judged as kubelet's and CRI-O's loaders judge each file
// (a .conflist through ConfListFromFile; any other through ConfFromFile, which needs a "type",
// then ConfListFromConf). Files it skips are named on stderr with libcni's reason.
//
//	libcni-oracle DIR    prints the chosen file's base name, or nothing when none loads
//
// A test oracle for the agent's choice of the file it chains into (tests/install).
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

func load(file string) error {
	var list *libcni.NetworkConfigList
	var err error
	if strings.HasSuffix(file, ".conflist") {
		list, err = libcni.ConfListFromFile(file)
		if err != nil {
			return err
		}
	} else {
		conf, err := libcni.ConfFromFile(file)
		if err != nil {
			return err
		}
		if conf.Network.Type == "" {
			return fmt.Errorf("network type not found")
		}
		list, err = libcni.ConfListFromConf(conf)
		if err != nil {
			return err
		}
	}
	if len(list.Plugins) == 0 {
		return fmt.Errorf("config list has no plugins")
	}
	return nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: libcni-oracle DIR")
		os.Exit(2)
	}
	files, err := libcni.ConfFiles(os.Args[1], []string{".conf", ".conflist", ".json"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, file := range files { // sorted by libcni
		if err := load(file); err != nil {
			fmt.Fprintf(os.Stderr, "skip %s: %v\n", filepath.Base(file), err)
			continue
		}
		fmt.Println(filepath.Base(file))
		return
	}
}
