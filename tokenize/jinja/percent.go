package jinja

// printf-style formatting (str % args), as CPython implements it.

import (
	"math"
	"math/big"
	"strconv"
	"strings"
)

func percentFormat(format string, arg Value) (string, error) {
	var args []Value
	var mapping *Dict
	switch arg.k {
	case kindTuple:
		args = arg.list().items
	case KindDict:
		mapping = arg.dict()
		args = []Value{arg}
	default:
		args = []Value{arg}
	}
	var b strings.Builder
	ai := 0
	usedMapping := false
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(format) {
			return "", errorf("ValueError", "incomplete format")
		}
		var val Value
		haveVal := false
		if format[i] == '(' {
			if mapping == nil {
				return "", errorf("TypeError", "format requires a mapping")
			}
			end := strings.IndexByte(format[i:], ')')
			if end < 0 {
				return "", errorf("ValueError", "incomplete format key")
			}
			key := format[i+1 : i+end]
			v, ok := mapping.Get(key)
			if !ok {
				return "", errorf("KeyError", "%s", pyQuote(key))
			}
			val, haveVal, usedMapping = v, true, true
			i += end + 1
		}
		flags := ""
		for i < len(format) && strings.IndexByte("-+ #0", format[i]) >= 0 {
			flags += string(format[i])
			i++
		}
		width := -1
		if i < len(format) && format[i] == '*' {
			if ai >= len(args) {
				return "", errorf("TypeError", "not enough arguments for format string")
			}
			width = int(args[ai].n)
			ai++
			i++
		} else {
			for i < len(format) && format[i] >= '0' && format[i] <= '9' {
				if width < 0 {
					width = 0
				}
				width = width*10 + int(format[i]-'0')
				i++
			}
		}
		prec := -1
		if i < len(format) && format[i] == '.' {
			i++
			prec = 0
			for i < len(format) && format[i] >= '0' && format[i] <= '9' {
				prec = prec*10 + int(format[i]-'0')
				i++
			}
		}
		for i < len(format) && (format[i] == 'l' || format[i] == 'h' || format[i] == 'L') {
			i++
		}
		if i >= len(format) {
			return "", errorf("ValueError", "incomplete format")
		}
		conv := format[i]
		if conv == '%' {
			b.WriteByte('%')
			continue
		}
		if !haveVal {
			if ai >= len(args) {
				return "", errorf("TypeError", "not enough arguments for format string")
			}
			val = args[ai]
			ai++
		}
		s, err := formatOne(conv, flags, prec, val)
		if err != nil {
			return "", err
		}
		b.WriteString(pad(s, width, flags, conv))
	}
	if ai < len(args) && !usedMapping && mapping == nil {
		return "", errorf("TypeError", "not all arguments converted during string formatting")
	}
	return b.String(), nil
}

func pad(s string, width int, flags string, conv byte) string {
	n := strLen(s)
	if width <= n {
		return s
	}
	fill := width - n
	switch {
	case strings.Contains(flags, "-"):
		return s + strings.Repeat(" ", fill)
	case strings.Contains(flags, "0") && strings.IndexByte("diouxXeEfFgG", conv) >= 0:
		sign := ""
		if s != "" && (s[0] == '-' || s[0] == '+' || s[0] == ' ') {
			sign, s = s[:1], s[1:]
		}
		return sign + strings.Repeat("0", fill) + s
	}
	return strings.Repeat(" ", fill) + s
}

func formatOne(conv byte, flags string, prec int, v Value) (string, error) {
	if v.k == KindUndefined && conv != 's' {
		return "", undefinedError(v)
	}
	sign := func(s string, neg bool) string {
		switch {
		case neg:
			return "-" + s
		case strings.Contains(flags, "+"):
			return "+" + s
		case strings.Contains(flags, " "):
			return " " + s
		}
		return s
	}
	switch conv {
	case 's':
		s := v.String()
		if prec >= 0 {
			s = truncRunes(s, prec)
		}
		return s, nil
	case 'r', 'a':
		s := v.Repr()
		if prec >= 0 {
			s = truncRunes(s, prec)
		}
		return s, nil
	case 'd', 'i', 'u':
		if !v.isNumber() {
			return "", errorf("TypeError", "%%%c format: a real number is required, not %s", conv, v.TypeName())
		}
		var n *big.Int
		if v.k == KindFloat {
			if math.IsInf(v.f, 0) || math.IsNaN(v.f) {
				return "", errorf("OverflowError", "cannot convert float infinity to integer")
			}
			n, _ = new(big.Float).SetFloat64(math.Trunc(v.f)).Int(nil)
		} else {
			n = bigOf(v)
		}
		s := new(big.Int).Abs(n).String()
		for prec > len(s) {
			s = "0" + s
		}
		return sign(s, n.Sign() < 0), nil
	case 'x', 'X', 'o':
		if !v.isInteger() {
			return "", errorf("TypeError", "%%%c format: an integer is required, not %s", conv, v.TypeName())
		}
		n := bigOf(v)
		base := 16
		if conv == 'o' {
			base = 8
		}
		s := new(big.Int).Abs(n).Text(base)
		if conv == 'X' {
			s = strings.ToUpper(s)
		}
		if strings.Contains(flags, "#") {
			s = map[byte]string{'x': "0x", 'X': "0X", 'o': "0o"}[conv] + s
		}
		return sign(s, n.Sign() < 0), nil
	case 'e', 'E', 'f', 'F', 'g', 'G':
		f, err := asFloat(v)
		if err != nil {
			return "", errorf("TypeError", "must be real number, not %s", v.TypeName())
		}
		if prec < 0 {
			prec = 6
		}
		return sign(formatFloat(math.Abs(f), conv, prec, strings.Contains(flags, "#")), math.Signbit(f) && !math.IsNaN(f)), nil
	case 'c':
		if v.k == KindString && strLen(v.s) == 1 {
			return v.s, nil
		}
		if v.isInteger() {
			return string(rune(v.n)), nil
		}
		return "", errorf("TypeError", "%%c requires int or char")
	}
	return "", errorf("ValueError", "unsupported format character '%c' (0x%x)", conv, conv)
}

func truncRunes(s string, n int) string {
	i := 0
	for pos := range s {
		if i == n {
			return s[:pos]
		}
		i++
	}
	return s
}

// formatFloat formats a non-negative float like Python's %e/%f/%g.
func formatFloat(f float64, conv byte, prec int, alt bool) string {
	if math.IsInf(f, 0) {
		if conv >= 'a' {
			return "inf"
		}
		return "INF"
	}
	if math.IsNaN(f) {
		if conv >= 'a' {
			return "nan"
		}
		return "NAN"
	}
	switch conv {
	case 'f', 'F':
		return strconv.FormatFloat(f, 'f', prec, 64)
	case 'e', 'E':
		s := strconv.FormatFloat(f, 'e', prec, 64)
		if conv == 'E' {
			s = strings.ToUpper(s)
		}
		return s
	}
	// %g
	if prec == 0 {
		prec = 1
	}
	exp := 0
	if f != 0 {
		es := strconv.FormatFloat(f, 'e', prec-1, 64)
		exp, _ = strconv.Atoi(es[strings.IndexByte(es, 'e')+1:])
	}
	var s string
	if exp < -4 || exp >= prec {
		s = strconv.FormatFloat(f, 'e', prec-1, 64)
		if !alt {
			mant, ex, _ := strings.Cut(s, "e")
			if strings.Contains(mant, ".") {
				mant = strings.TrimRight(strings.TrimRight(mant, "0"), ".")
			}
			s = mant + "e" + ex
		}
	} else {
		s = strconv.FormatFloat(f, 'f', prec-1-exp, 64)
		if !alt && strings.Contains(s, ".") {
			s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
		}
	}
	if conv == 'G' {
		s = strings.ToUpper(s)
	}
	return s
}
