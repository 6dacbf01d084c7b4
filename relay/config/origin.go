package config

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// origin remembers where the keys of a configuration were set: the line
// of each key in the operator's file, and the environment variables that
// were present. Validation and the host checks name keys; origin turns a
// key into the place the operator has to edit.
type origin struct {
	file  string
	lines map[string]int  // key path (listeners[0].address) → line in file
	env   map[string]bool // GREYRELAY_ variables that were set
}

// keyLines maps every key path of a YAML file to its line. A file that
// does not parse has no lines (its syntax error already names one).
func keyLines(b []byte) map[string]int {
	var doc yaml.Node
	if yaml.Unmarshal(b, &doc) != nil {
		return nil
	}
	lines := map[string]int{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := join(path, n.Content[i].Value)
				lines[p] = n.Content[i].Line
				walk(n.Content[i+1], p)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				p := fmt.Sprintf("%s[%d]", path, i)
				lines[p] = c.Line
				walk(c, p)
			}
		}
	}
	walk(&doc, "")
	return lines
}

// locate prefixes an error that starts with a key ("queue.path: …") with
// where that key was set: the environment variable that overrode it, or
// the file and line of the key (or of the nearest enclosing key the file
// sets). An error about a key left at its default is returned as it is.
func (o origin) locate(err error) error {
	key, _, ok := strings.Cut(err.Error(), ": ")
	if !ok || strings.ContainsAny(key, " \t") {
		return err
	}
	if name := envName(key); o.env[name] {
		return fmt.Errorf("environment %s: %w", name, err)
	}
	for k := key; k != ""; k = parentKey(k) {
		if n, ok := o.lines[k]; ok {
			return fmt.Errorf("%s: line %d: %w", o.file, n, err)
		}
	}
	return err
}

// parentKey drops the last element of a key path: listeners[0].tls_cert
// → listeners[0] → listeners.
func parentKey(k string) string {
	i := strings.LastIndexAny(k, ".[")
	if i < 0 {
		return ""
	}
	return k[:i]
}

// envName is the environment variable of a key path (see applyEnv).
func envName(key string) string {
	r := strings.NewReplacer(".", "_", "[", "_", "]", "")
	return EnvPrefix + strings.ToUpper(r.Replace(key))
}
