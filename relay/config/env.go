package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// EnvPrefix starts every environment variable greyrelay reads.
const EnvPrefix = "GREYRELAY_"

var durationType = reflect.TypeOf(time.Duration(0))

// applyEnv overrides every scalar key from the environment. The variable
// name is the YAML path upper-cased and joined with "_": delivery.port is
// GREYRELAY_DELIVERY_PORT. Lists of scalars are comma-separated; maps are
// "key=value,key=value"; list-of-struct fields are indexed
// (GREYRELAY_LISTENERS_0_ADDRESS), and an index one past the end appends.
func applyEnv(c *Config, getenv func(string) (string, bool)) error {
	return envStruct(reflect.ValueOf(c).Elem(), EnvPrefix, getenv)
}

func envStruct(v reflect.Value, prefix string, getenv func(string) (string, bool)) error {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]
		if tag == "" || tag == "-" {
			continue
		}
		name := prefix + strings.ToUpper(tag)
		if err := envField(v.Field(i), name, getenv); err != nil {
			return err
		}
	}
	return nil
}

func envField(f reflect.Value, name string, getenv func(string) (string, bool)) error {
	switch {
	case f.Kind() == reflect.Struct:
		return envStruct(f, name+"_", getenv)
	case f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.Struct:
		return envStructSlice(f, name+"_", getenv)
	}
	s, ok := getenv(name)
	if !ok {
		return nil
	}
	if err := setScalar(f, s); err != nil {
		return fmt.Errorf("environment %s: %w", name, err)
	}
	return nil
}

// envStructSlice handles indexed variables for lists of structs. Only the
// listener list uses this; rules are too structured for the environment.
func envStructSlice(f reflect.Value, prefix string, getenv func(string) (string, bool)) error {
	for i := 0; ; i++ {
		p := prefix + strconv.Itoa(i) + "_"
		elem := reflect.New(f.Type().Elem()).Elem()
		if i < f.Len() {
			elem.Set(f.Index(i))
		}
		before := elem.Interface()
		if err := envStruct(elem, p, getenv); err != nil {
			return err
		}
		changed := !reflect.DeepEqual(before, elem.Interface())
		switch {
		case i < f.Len():
			f.Index(i).Set(elem)
		case changed:
			f.Set(reflect.Append(f, elem))
		default:
			return nil
		}
	}
}

func setScalar(f reflect.Value, s string) error {
	if f.Type() == durationType {
		d, err := ParseDuration(s)
		if err != nil {
			return err
		}
		f.SetInt(int64(d))
		return nil
	}
	switch f.Kind() {
	case reflect.String:
		f.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		f.SetBool(b)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return err
		}
		f.SetInt(n)
	case reflect.Float64:
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return err
		}
		f.SetFloat(x)
	case reflect.Slice:
		return setList(f, s)
	case reflect.Map:
		return setMap(f, s)
	default:
		return fmt.Errorf("cannot be set from the environment")
	}
	return nil
}

func setList(f reflect.Value, s string) error {
	out := reflect.MakeSlice(f.Type(), 0, 4)
	for _, part := range splitList(s) {
		e := reflect.New(f.Type().Elem()).Elem()
		if e.Kind() == reflect.Struct {
			return fmt.Errorf("cannot be set from the environment")
		}
		if err := setScalar(e, part); err != nil {
			return err
		}
		out = reflect.Append(out, e)
	}
	f.Set(out)
	return nil
}

func setMap(f reflect.Value, s string) error {
	if f.Type().Elem().Kind() != reflect.String {
		return fmt.Errorf("cannot be set from the environment")
	}
	m := reflect.MakeMap(f.Type())
	for _, part := range splitList(s) {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return fmt.Errorf("%q is not key=value", part)
		}
		m.SetMapIndex(reflect.ValueOf(strings.TrimSpace(k)), reflect.ValueOf(strings.TrimSpace(v)))
	}
	f.Set(m)
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
