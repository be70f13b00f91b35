package jinja

// Globals of the transformers environment: range, dict, namespace, cycler, joiner,
// raise_exception and strftime_now.

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

func globalRange(_ *evaluator, args []Value, kw kwargs) (Value, error) {
	if len(kw.names) > 0 {
		return Value{}, errorf("TypeError", "range() takes no keyword arguments")
	}
	var start, stop, step int64 = 0, 0, 1
	ints := make([]int64, len(args))
	for i, a := range args {
		if a.k != KindInt && a.k != KindBool {
			if a.k == KindUndefined {
				return Value{}, undefinedError(a)
			}
			return Value{}, errorf("TypeError", "'%s' object cannot be interpreted as an integer", a.TypeName())
		}
		ints[i] = a.n
	}
	switch len(args) {
	case 1:
		stop = ints[0]
	case 2:
		start, stop = ints[0], ints[1]
	case 3:
		start, stop, step = ints[0], ints[1], ints[2]
	default:
		return Value{}, errorf("TypeError", "range expected at most 3 arguments, got %d", len(args))
	}
	if step == 0 {
		return Value{}, errorf("ValueError", "range() arg 3 must not be zero")
	}
	var n int64
	if step > 0 && stop > start {
		n = (stop - start + step - 1) / step
	} else if step < 0 && stop < start {
		n = (start - stop - step - 1) / -step
	}
	if n > 100000 {
		return Value{}, errorf("OverflowError", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).")
	}
	out := make([]Value, n)
	for i := int64(0); i < n; i++ {
		out[i] = intValue(start + i*step)
	}
	return ListValue(out), nil
}

// dictFrom is dict(*args, **kwargs).
func dictFrom(fname string, args []Value, kw kwargs) (*Dict, error) {
	if len(args) > 1 {
		return nil, errorf("TypeError", "%s expected at most 1 argument, got %d", fname, len(args))
	}
	d := NewDict(len(kw.names))
	if len(args) == 1 {
		src := args[0]
		switch src.k {
		case KindDict:
			s := src.dict()
			for i := range s.keys {
				d.set(s.keys[i], s.vals[i])
			}
		default:
			items, err := iterate(src)
			if err != nil {
				return nil, err
			}
			for i, it := range items {
				pair, err := iterate(it)
				if err != nil {
					return nil, errorf("TypeError", "cannot convert dictionary update sequence element #%d to a sequence", i)
				}
				if len(pair) != 2 {
					return nil, errorf("ValueError", "dictionary update sequence element #%d has length %d; 2 is required", i, len(pair))
				}
				if !hashable(pair[0]) {
					return nil, errorf("TypeError", "unhashable type: '%s'", pair[0].TypeName())
				}
				d.set(pair[0], pair[1])
			}
		}
	}
	for i, n := range kw.names {
		d.set(StringValue(n), kw.vals[i])
	}
	return d, nil
}

func globalDict(_ *evaluator, args []Value, kw kwargs) (Value, error) {
	d, err := dictFrom("dict", args, kw)
	if err != nil {
		return Value{}, err
	}
	return DictValue(d), nil
}

func globalNamespace(_ *evaluator, args []Value, kw kwargs) (Value, error) {
	d, err := dictFrom("dict", args, kw)
	if err != nil {
		return Value{}, err
	}
	ns := &namespace{}
	for i, k := range d.keys {
		if k.k != KindString {
			return Value{}, errorf("TypeError", "keywords must be strings")
		}
		ns.keys = append(ns.keys, k.s)
		ns.vals = append(ns.vals, d.vals[i])
	}
	return Value{k: kindNamespace, o: ns}, nil
}

func globalCycler(_ *evaluator, args []Value, kw kwargs) (Value, error) {
	if len(kw.names) > 0 {
		return Value{}, errorf("TypeError", "cycler() got an unexpected keyword argument '%s'", kw.names[0])
	}
	if len(args) == 0 {
		return Value{}, errorf("RuntimeError", "at least one item has to be provided")
	}
	return Value{k: kindCycler, o: &cyclerState{items: append([]Value(nil), args...)}}, nil
}

func globalJoiner(_ *evaluator, args []Value, kw kwargs) (Value, error) {
	a, err := bind("joiner", []string{"sep"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	return Value{k: kindJoiner, o: &joinerState{sep: softStr(orDefault(a[0], StringValue(", ")))}}, nil
}

func globalRaiseException(_ *evaluator, args []Value, kw kwargs) (Value, error) {
	a, err := bind("raise_exception", []string{"message"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	if a[0].k == kindMissing {
		return Value{}, errorf("TypeError", "raise_exception() missing 1 required positional argument: 'message'")
	}
	return Value{}, &Error{Type: "TemplateError", Message: a[0].String()}
}

func globalStrftimeNow(e *evaluator, args []Value, kw kwargs) (Value, error) {
	a, err := bind("strftime_now", []string{"format"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	f, err := wantStr("strftime", a[0])
	if err != nil {
		return Value{}, err
	}
	now := time.Now
	if e.now != nil {
		now = e.now
	}
	return StringValue(strftime(now(), f)), nil
}

// strftime is datetime.strftime for a naive local datetime (C locale).
func strftime(t time.Time, f string) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		c := f[i]
		if c != '%' || i+1 >= len(f) {
			b.WriteByte(c)
			continue
		}
		i++
		switch f[i] {
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'w':
			b.WriteString(strconv.Itoa(int(t.Weekday())))
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'Y':
			b.WriteString(strconv.Itoa(t.Year()))
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			fmt.Fprintf(&b, "%02d", h)
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'f':
			fmt.Fprintf(&b, "%06d", t.Nanosecond()/1000)
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case 'z', 'Z':
			// datetime.now() is naive: empty
		case 'D':
			fmt.Fprintf(&b, "%02d/%02d/%02d", int(t.Month()), t.Day(), t.Year()%100)
		case 'F':
			fmt.Fprintf(&b, "%d-%02d-%02d", t.Year(), int(t.Month()), t.Day())
		case 'T':
			fmt.Fprintf(&b, "%02d:%02d:%02d", t.Hour(), t.Minute(), t.Second())
		case 'R':
			fmt.Fprintf(&b, "%02d:%02d", t.Hour(), t.Minute())
		case 'c':
			fmt.Fprintf(&b, "%s %s %2d %02d:%02d:%02d %d", t.Weekday().String()[:3], t.Month().String()[:3], t.Day(), t.Hour(), t.Minute(), t.Second(), t.Year())
		case 'x':
			fmt.Fprintf(&b, "%02d/%02d/%02d", int(t.Month()), t.Day(), t.Year()%100)
		case 'X':
			fmt.Fprintf(&b, "%02d:%02d:%02d", t.Hour(), t.Minute(), t.Second())
		case 'U':
			fmt.Fprintf(&b, "%02d", (t.YearDay()+6-int(t.Weekday()))/7)
		case 'W':
			fmt.Fprintf(&b, "%02d", (t.YearDay()+6-(int(t.Weekday())+6)%7)/7)
		case 'u':
			wd := int(t.Weekday())
			if wd == 0 {
				wd = 7
			}
			b.WriteString(strconv.Itoa(wd))
		case 'G':
			y, _ := t.ISOWeek()
			b.WriteString(strconv.Itoa(y))
		case 'V':
			_, w := t.ISOWeek()
			fmt.Fprintf(&b, "%02d", w)
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String()
}
