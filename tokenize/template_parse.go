package tokenize

// Parser of the chat-template interpreter: jinja2.parser.Parser's grammar (operator
// precedence, filters and tests binding to unary expressions, chained comparisons,
// conditional expressions, slices, call arguments) for the statements a chat template
// can use: if/elif/else, for (with else, if-filter, recursive), set (incl. namespace
// attributes and block sets), macro, call, filter, with, block, raw, break/continue
// (loopcontrols) and generation (transformers' AssistantTracker). include, import,
// from and extends parse but fail when executed, as they do in transformers (no loader).

import (
	"fmt"
	"strings"
)

// ---- AST ----

type jExpr interface{ jExprNode() }

type (
	jeConst   struct{ v jv }
	jeName    struct{ name string }
	jeGetattr struct {
		obj  jExpr
		name string
	}
	jeGetitem struct{ obj, key jExpr }
	jeSlice   struct{ start, stop, step jExpr } // only as a subscript
	jeCall    struct {
		fn   jExpr
		args jArgs
	}
	jeFilter struct {
		e    jExpr // nil inside {% filter %} / {% set x | f %} chains
		name string
		fn   jFilterFn // nil: unknown filter, an error when evaluated
		args jArgs
	}
	jeTest struct {
		e    jExpr
		name string
		fn   jTestFn
		args jArgs
	}
	jeNot struct{ e jExpr }
	jeNeg struct{ e jExpr }
	jePos struct{ e jExpr }
	jeBin struct {
		op   string
		l, r jExpr
	}
	jeAnd     struct{ l, r jExpr }
	jeOr      struct{ l, r jExpr }
	jeCompare struct {
		first jExpr
		ops   []string
		rest  []jExpr
	}
	jeConcat struct{ args []jExpr }
	jeCond   struct{ test, yes, no jExpr }
	jeList   struct{ items []jExpr }
	jeTuple  struct{ items []jExpr }
	jeDict   struct{ keys, vals []jExpr }
)

type jArgs struct {
	pos     []jExpr
	kwNames []string
	kwVals  []jExpr
	dynArgs jExpr
	dynKw   jExpr
}

func (*jeConst) jExprNode()   {}
func (*jeName) jExprNode()    {}
func (*jeGetattr) jExprNode() {}
func (*jeGetitem) jExprNode() {}
func (*jeSlice) jExprNode()   {}
func (*jeCall) jExprNode()    {}
func (*jeFilter) jExprNode()  {}
func (*jeTest) jExprNode()    {}
func (*jeNot) jExprNode()     {}
func (*jeNeg) jExprNode()     {}
func (*jePos) jExprNode()     {}
func (*jeBin) jExprNode()     {}
func (*jeAnd) jExprNode()     {}
func (*jeOr) jExprNode()      {}
func (*jeCompare) jExprNode() {}
func (*jeConcat) jExprNode()  {}
func (*jeCond) jExprNode()    {}
func (*jeList) jExprNode()    {}
func (*jeTuple) jExprNode()   {}
func (*jeDict) jExprNode()    {}

type jNode interface{ jStmtNode() }

type (
	jnData   struct{ s string }
	jnOutput struct{ e jExpr }
	jnIf     struct {
		tests  []jExpr
		bodies [][]jNode
		els    []jNode
	}
	jnFor struct {
		target    *jTarget
		iter      jExpr
		cond      jExpr
		recursive bool
		body, els []jNode
		fresh     bool // the body defines a macro: each iteration needs its own scope
	}
	jnSet struct {
		target *jTarget
		e      jExpr
	}
	jnSetBlock struct {
		target *jTarget
		filter jExpr // *jeFilter chain or nil
		body   []jNode
	}
	jnMacro     struct{ m *jMacro }
	jnCallBlock struct {
		call   *jeCall
		caller *jMacro
	}
	jnFilterBlock struct {
		filter jExpr
		body   []jNode
	}
	jnWith struct {
		targets []*jTarget
		vals    []jExpr
		body    []jNode
	}
	jnBreak       struct{}
	jnContinue    struct{}
	jnBlock       struct{ body []jNode }
	jnGeneration  struct{ body []jNode }
	jnUnsupported struct{ msg string }
)

func (*jnData) jStmtNode()        {}
func (*jnOutput) jStmtNode()      {}
func (*jnIf) jStmtNode()          {}
func (*jnFor) jStmtNode()         {}
func (*jnSet) jStmtNode()         {}
func (*jnSetBlock) jStmtNode()    {}
func (*jnMacro) jStmtNode()       {}
func (*jnCallBlock) jStmtNode()   {}
func (*jnFilterBlock) jStmtNode() {}
func (*jnWith) jStmtNode()        {}
func (*jnBreak) jStmtNode()       {}
func (*jnContinue) jStmtNode()    {}
func (*jnBlock) jStmtNode()       {}
func (*jnGeneration) jStmtNode()  {}
func (*jnUnsupported) jStmtNode() {}

// jTarget is an assignment target: a name, a (nested) tuple of names, or ns.attr.
type jTarget struct {
	name  string
	attr  string // set for namespace attribute targets
	elems []*jTarget
	tuple bool
}

type jMacro struct {
	name         string
	params       []string
	defaults     []jExpr // for the last len(defaults) params
	body         []jNode
	catchVarargs bool
	catchKwargs  bool
	usesCaller   bool
}

// ---- parser ----

type jParser struct {
	toks []jToken
	pos  int
	soft int // >0 inside if/conditional expressions: unknown filters fail at run time
	// endStack holds the names that end the blocks being parsed, for error messages.
	endStack [][]string
	loops    int
	depth    int // nesting of expressions and statements, bounded like Python's recursion
}

// jMaxNesting bounds expression and statement nesting (jinja2 would hit Python's
// recursion limit on pathological templates).
const jMaxNesting = 256

func jParse(src string) ([]jNode, error) {
	toks, err := jLex(src)
	if err != nil {
		return nil, err
	}
	p := &jParser{toks: toks}
	body, err := p.subparse(nil)
	if err != nil {
		return nil, err
	}
	if p.cur().t != jtEOF {
		return nil, p.fail("unexpected %s", p.cur().describe())
	}
	return body, nil
}

func (p *jParser) cur() jToken { return p.toks[p.pos] }

func (p *jParser) look() jToken {
	if p.pos+1 < len(p.toks) {
		return p.toks[p.pos+1]
	}
	return p.toks[len(p.toks)-1]
}

func (p *jParser) next() jToken {
	t := p.toks[p.pos]
	if p.pos < len(p.toks)-1 {
		p.pos++
	}
	return t
}

func (p *jParser) fail(format string, args ...any) error {
	return &jSyntaxError{msg: fmt.Sprintf(format, args...), line: p.cur().line}
}

func (p *jParser) isOp(op string) bool {
	t := p.cur()
	return t.t == jtOp && t.s == op
}

func (p *jParser) isName(name string) bool {
	t := p.cur()
	return t.t == jtName && t.s == name
}

func (p *jParser) skipOp(op string) bool {
	if p.isOp(op) {
		p.next()
		return true
	}
	return false
}

func (p *jParser) skipName(name string) bool {
	if p.isName(name) {
		p.next()
		return true
	}
	return false
}

func (p *jParser) expectOp(op string) error {
	if !p.skipOp(op) {
		return p.fail("expected token '%s', got '%s'", op, p.cur().describe())
	}
	return nil
}

func (p *jParser) expectName() (string, error) {
	t := p.cur()
	if t.t != jtName {
		return "", p.fail("expected token 'name', got '%s'", t.describe())
	}
	p.next()
	return t.s, nil
}

func (p *jParser) expect(tt jTokType, what string) error {
	if p.cur().t != tt {
		return p.fail("expected token '%s', got '%s'", what, p.cur().describe())
	}
	p.next()
	return nil
}

// subparse parses template data and statements until a block whose first name is one
// of end (the block_begin is consumed; the name token is current).
func (p *jParser) subparse(end []string) ([]jNode, error) {
	var body []jNode
	if end != nil {
		p.endStack = append(p.endStack, end)
		defer func() { p.endStack = p.endStack[:len(p.endStack)-1] }()
	}
	for {
		t := p.cur()
		switch t.t {
		case jtEOF:
			return body, nil
		case jtData:
			body = append(body, &jnData{s: t.s})
			p.next()
		case jtVarBegin:
			p.next()
			e, err := p.parseTuple(false, true, nil, false)
			if err != nil {
				return nil, err
			}
			body = append(body, &jnOutput{e: e})
			if err := p.expect(jtVarEnd, "end of print statement"); err != nil {
				return nil, err
			}
		case jtBlockBegin:
			p.next()
			if end != nil && p.cur().t == jtName {
				for _, e := range end {
					if p.cur().s == e {
						return body, nil
					}
				}
			}
			n, err := p.parseStatement()
			if err != nil {
				return nil, err
			}
			if n != nil {
				body = append(body, n)
			}
			if err := p.expect(jtBlockEnd, "end of statement block"); err != nil {
				return nil, err
			}
		default:
			return nil, p.fail("unexpected %s", t.describe())
		}
	}
}

// parseStatements parses the body of a block statement: the current token must be the
// end of the opening tag; it stops at one of end. With drop the end name is consumed.
func (p *jParser) parseStatements(end []string, drop bool) ([]jNode, error) {
	p.skipOp(":")
	if err := p.expect(jtBlockEnd, "end of statement block"); err != nil {
		return nil, err
	}
	body, err := p.subparse(end)
	if err != nil {
		return nil, err
	}
	if p.cur().t == jtEOF {
		return nil, p.fail("Unexpected end of template. Jinja was looking for the following tags: %s. The innermost block that needs to be closed is '%s'.",
			strings.Join(quoteAll(end), " or "), strings.TrimPrefix(end[0], "end"))
	}
	if drop {
		p.next()
	}
	return body, nil
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = "'" + x + "'"
	}
	return out
}

func (p *jParser) parseStatement() (jNode, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > jMaxNesting {
		return nil, p.fail("template nesting too deep")
	}
	t := p.cur()
	if t.t != jtName {
		return nil, p.fail("tag name expected")
	}
	switch t.s {
	case "if":
		return p.parseIf()
	case "for":
		return p.parseFor()
	case "set":
		return p.parseSet()
	case "macro":
		return p.parseMacro()
	case "call":
		return p.parseCallBlock()
	case "filter":
		return p.parseFilterBlock()
	case "with":
		return p.parseWith()
	case "print":
		p.next()
		var items []jExpr
		for p.cur().t != jtBlockEnd {
			if len(items) > 0 {
				if err := p.expectOp(","); err != nil {
					return nil, err
				}
			}
			e, err := p.parseExpression(true)
			if err != nil {
				return nil, err
			}
			items = append(items, e)
		}
		if len(items) == 1 {
			return &jnOutput{e: items[0]}, nil
		}
		return &jnOutput{e: &jeConcat{args: items}}, nil
	case "break", "continue":
		p.next()
		if p.loops == 0 {
			return nil, p.fail("'%s' outside of a loop", t.s)
		}
		if t.s == "break" {
			return &jnBreak{}, nil
		}
		return &jnContinue{}, nil
	case "generation":
		p.next()
		body, err := p.parseStatements([]string{"endgeneration"}, true)
		if err != nil {
			return nil, err
		}
		return &jnGeneration{body: body}, nil
	case "block":
		p.next()
		if _, err := p.expectName(); err != nil {
			return nil, err
		}
		p.skipName("scoped")
		p.skipName("required")
		body, err := p.parseStatements([]string{"endblock"}, true)
		if err != nil {
			return nil, err
		}
		if p.cur().t == jtName {
			p.next() // {% endblock name %}
		}
		return &jnBlock{body: body}, nil
	case "autoescape":
		p.next()
		if _, err := p.parseExpression(true); err != nil {
			return nil, err
		}
		body, err := p.parseStatements([]string{"endautoescape"}, true)
		if err != nil {
			return nil, err
		}
		return &jnBlock{body: body}, nil
	case "include", "import", "from", "extends":
		// These need a template loader; transformers has none, so they fail when run.
		p.next()
		for p.cur().t != jtBlockEnd && p.cur().t != jtEOF {
			p.next()
		}
		return &jnUnsupported{msg: "no loader for this environment specified"}, nil
	}
	if strings.HasPrefix(t.s, "end") || t.s == "else" || t.s == "elif" {
		if len(p.endStack) > 0 {
			return nil, p.fail("Encountered unknown tag '%s'. Jinja was looking for the following tags: %s.", t.s, strings.Join(quoteAll(p.endStack[len(p.endStack)-1]), " or "))
		}
	}
	return nil, p.fail("Encountered unknown tag '%s'.", t.s)
}

func (p *jParser) parseIf() (jNode, error) {
	p.next() // if
	n := &jnIf{}
	p.soft++
	defer func() { p.soft-- }()
	for {
		test, err := p.parseTuple(false, false, nil, false)
		if err != nil {
			return nil, err
		}
		body, err := p.parseStatements([]string{"elif", "else", "endif"}, false)
		if err != nil {
			return nil, err
		}
		n.tests = append(n.tests, test)
		n.bodies = append(n.bodies, body)
		tok := p.next()
		switch tok.s {
		case "elif":
			continue
		case "else":
			els, err := p.parseStatements([]string{"endif"}, true)
			if err != nil {
				return nil, err
			}
			n.els = els
		}
		return n, nil
	}
}

func (p *jParser) parseFor() (jNode, error) {
	p.next() // for
	target, err := p.parseAssignTarget(true, false, []string{"in"}, false)
	if err != nil {
		return nil, err
	}
	if !p.skipName("in") {
		return nil, p.fail("expected token 'in', got '%s'", p.cur().describe())
	}
	iter, err := p.parseTuple(false, false, []string{"recursive"}, false)
	if err != nil {
		return nil, err
	}
	n := &jnFor{target: target, iter: iter}
	if p.skipName("if") {
		if n.cond, err = p.parseExpression(true); err != nil {
			return nil, err
		}
	}
	n.recursive = p.skipName("recursive")
	p.loops++
	n.body, err = p.parseStatements([]string{"endfor", "else"}, false)
	p.loops--
	if err != nil {
		return nil, err
	}
	if p.next().s == "else" {
		if n.els, err = p.parseStatements([]string{"endfor"}, true); err != nil {
			return nil, err
		}
	}
	n.fresh = jDefinesMacro(n.body)
	return n, nil
}

func jDefinesMacro(body []jNode) bool {
	found := false
	jWalkStmts(body, func(n jNode) bool {
		switch n.(type) {
		case *jnMacro, *jnCallBlock:
			found = true
		}
		return !found
	})
	return found
}

func (p *jParser) parseSet() (jNode, error) {
	p.next() // set
	target, err := p.parseAssignTarget(true, false, nil, true)
	if err != nil {
		return nil, err
	}
	if p.skipOp("=") {
		e, err := p.parseTuple(false, true, nil, false)
		if err != nil {
			return nil, err
		}
		return &jnSet{target: target, e: e}, nil
	}
	filter, err := p.parseFilter(nil, false)
	if err != nil {
		return nil, err
	}
	body, err := p.parseStatements([]string{"endset"}, true)
	if err != nil {
		return nil, err
	}
	return &jnSetBlock{target: target, filter: filter, body: body}, nil
}

func (p *jParser) parseWith() (jNode, error) {
	p.next() // with
	n := &jnWith{}
	for p.cur().t != jtBlockEnd {
		if len(n.targets) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		t, err := p.parseAssignTarget(true, false, nil, false)
		if err != nil {
			return nil, err
		}
		if err := p.expectOp("="); err != nil {
			return nil, err
		}
		v, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		n.targets = append(n.targets, t)
		n.vals = append(n.vals, v)
	}
	body, err := p.parseStatements([]string{"endwith"}, true)
	if err != nil {
		return nil, err
	}
	n.body = body
	return n, nil
}

func (p *jParser) parseSignature(m *jMacro) error {
	if err := p.expectOp("("); err != nil {
		return err
	}
	for !p.isOp(")") {
		if len(m.params) > 0 {
			if err := p.expectOp(","); err != nil {
				return err
			}
		}
		name, err := p.expectName()
		if err != nil {
			return err
		}
		if p.skipOp("=") {
			d, err := p.parseExpression(true)
			if err != nil {
				return err
			}
			m.defaults = append(m.defaults, d)
		} else if len(m.defaults) > 0 {
			return p.fail("non-default argument follows default argument")
		} else if name == "caller" {
			return p.fail("When defining macros or call blocks the special \"caller\" argument must be omitted or be given a default.")
		}
		m.params = append(m.params, name)
	}
	p.next()
	return nil
}

func (p *jParser) parseMacro() (jNode, error) {
	p.next() // macro
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	m := &jMacro{name: name}
	if err := p.parseSignature(m); err != nil {
		return nil, err
	}
	loops := p.loops
	p.loops = 0
	m.body, err = p.parseStatements([]string{"endmacro"}, true)
	p.loops = loops
	if err != nil {
		return nil, err
	}
	jMacroFlags(m)
	return &jnMacro{m: m}, nil
}

// jMacroFlags records whether the body references varargs, kwargs or caller
// (jinja2 enables those only for macros that use them).
func jMacroFlags(m *jMacro) {
	jWalkExprsInStmts(m.body, func(e jExpr) {
		if n, ok := e.(*jeName); ok {
			switch n.name {
			case "varargs":
				m.catchVarargs = true
			case "kwargs":
				m.catchKwargs = true
			case "caller":
				m.usesCaller = true
			}
		}
	})
}

func (p *jParser) parseCallBlock() (jNode, error) {
	p.next() // call
	caller := &jMacro{name: "caller"}
	if p.isOp("(") {
		if err := p.parseSignature(caller); err != nil {
			return nil, err
		}
	}
	e, err := p.parseExpression(true)
	if err != nil {
		return nil, err
	}
	call, ok := e.(*jeCall)
	if !ok {
		return nil, p.fail("expected call")
	}
	loops := p.loops
	p.loops = 0
	caller.body, err = p.parseStatements([]string{"endcall"}, true)
	p.loops = loops
	if err != nil {
		return nil, err
	}
	jMacroFlags(caller)
	return &jnCallBlock{call: call, caller: caller}, nil
}

func (p *jParser) parseFilterBlock() (jNode, error) {
	p.next() // filter
	f, err := p.parseFilter(nil, true)
	if err != nil {
		return nil, err
	}
	body, err := p.parseStatements([]string{"endfilter"}, true)
	if err != nil {
		return nil, err
	}
	return &jnFilterBlock{filter: f, body: body}, nil
}

// parseAssignTarget mirrors Parser.parse_assign_target.
func (p *jParser) parseAssignTarget(withTuple, nameOnly bool, extraEnd []string, withNamespace bool) (*jTarget, error) {
	if withNamespace && p.look().t == jtOp && p.look().s == "." {
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		p.next() // dot
		attr, err := p.expectName()
		if err != nil {
			return nil, err
		}
		return &jTarget{name: name, attr: attr}, nil
	}
	if nameOnly {
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		return &jTarget{name: name}, nil
	}
	var e jExpr
	var err error
	if withTuple {
		e, err = p.parseTuple(true, true, extraEnd, false)
	} else {
		e, err = p.parsePrimary()
	}
	if err != nil {
		return nil, err
	}
	return p.toTarget(e)
}

func (p *jParser) toTarget(e jExpr) (*jTarget, error) {
	switch x := e.(type) {
	case *jeName:
		switch x.name {
		case "true", "false", "none", "True", "False", "None":
			return nil, p.fail("can't assign to 'const'")
		}
		return &jTarget{name: x.name}, nil
	case *jeTuple:
		t := &jTarget{tuple: true}
		for _, it := range x.items {
			sub, err := p.toTarget(it)
			if err != nil {
				return nil, err
			}
			t.elems = append(t.elems, sub)
		}
		return t, nil
	}
	return nil, p.fail("can't assign to %s", jExprKindName(e))
}

func jExprKindName(e jExpr) string {
	switch e.(type) {
	case *jeConst:
		return "'const'"
	case *jeCall:
		return "'call'"
	case *jeGetattr:
		return "'getattr'"
	case *jeGetitem:
		return "'getitem'"
	case *jeList:
		return "'list'"
	}
	return "'expression'"
}

// ---- expressions ----

func (p *jParser) parseExpression(withCondExpr bool) (jExpr, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > jMaxNesting {
		return nil, p.fail("expression nesting too deep")
	}
	if withCondExpr {
		return p.parseCondExpr()
	}
	return p.parseOr()
}

func (p *jParser) parseCondExpr() (jExpr, error) {
	e1, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	for p.skipName("if") {
		p.soft++
		e2, err := p.parseOr()
		if err != nil {
			p.soft--
			return nil, err
		}
		var e3 jExpr
		if p.skipName("else") {
			if e3, err = p.parseCondExpr(); err != nil {
				p.soft--
				return nil, err
			}
		}
		p.soft--
		e1 = &jeCond{test: e2, yes: e1, no: e3}
	}
	return e1, nil
}

func (p *jParser) parseOr() (jExpr, error) {
	l, err := p.parseAnd()
	if err != nil {
		return nil, err
	}
	for p.skipName("or") {
		r, err := p.parseAnd()
		if err != nil {
			return nil, err
		}
		l = &jeOr{l: l, r: r}
	}
	return l, nil
}

func (p *jParser) parseAnd() (jExpr, error) {
	l, err := p.parseNot()
	if err != nil {
		return nil, err
	}
	for p.skipName("and") {
		r, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		l = &jeAnd{l: l, r: r}
	}
	return l, nil
}

func (p *jParser) parseNot() (jExpr, error) {
	if p.skipName("not") {
		p.depth++
		defer func() { p.depth-- }()
		if p.depth > jMaxNesting {
			return nil, p.fail("expression nesting too deep")
		}
		e, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return &jeNot{e: e}, nil
	}
	return p.parseCompare()
}

func (p *jParser) parseCompare() (jExpr, error) {
	e, err := p.parseMath1()
	if err != nil {
		return nil, err
	}
	var ops []string
	var rest []jExpr
	for {
		t := p.cur()
		op := ""
		switch {
		case t.t == jtOp && (t.s == "==" || t.s == "!=" || t.s == ">" || t.s == ">=" || t.s == "<" || t.s == "<="):
			p.next()
			op = t.s
		case t.t == jtName && t.s == "in":
			p.next()
			op = "in"
		case t.t == jtName && t.s == "not" && p.look().t == jtName && p.look().s == "in":
			p.next()
			p.next()
			op = "notin"
		default:
			if len(ops) == 0 {
				return e, nil
			}
			return &jeCompare{first: e, ops: ops, rest: rest}, nil
		}
		r, err := p.parseMath1()
		if err != nil {
			return nil, err
		}
		ops = append(ops, op)
		rest = append(rest, r)
	}
}

func (p *jParser) parseMath1() (jExpr, error) {
	l, err := p.parseConcat()
	if err != nil {
		return nil, err
	}
	for p.isOp("+") || p.isOp("-") {
		op := p.next().s
		r, err := p.parseConcat()
		if err != nil {
			return nil, err
		}
		l = &jeBin{op: op, l: l, r: r}
	}
	return l, nil
}

func (p *jParser) parseConcat() (jExpr, error) {
	e, err := p.parseMath2()
	if err != nil {
		return nil, err
	}
	if !p.isOp("~") {
		return e, nil
	}
	args := []jExpr{e}
	for p.skipOp("~") {
		e, err := p.parseMath2()
		if err != nil {
			return nil, err
		}
		args = append(args, e)
	}
	return &jeConcat{args: args}, nil
}

func (p *jParser) parseMath2() (jExpr, error) {
	l, err := p.parsePow()
	if err != nil {
		return nil, err
	}
	for p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%") {
		op := p.next().s
		r, err := p.parsePow()
		if err != nil {
			return nil, err
		}
		l = &jeBin{op: op, l: l, r: r}
	}
	return l, nil
}

func (p *jParser) parsePow() (jExpr, error) {
	l, err := p.parseUnary(true)
	if err != nil {
		return nil, err
	}
	for p.skipOp("**") {
		r, err := p.parseUnary(true)
		if err != nil {
			return nil, err
		}
		l = &jeBin{op: "**", l: l, r: r}
	}
	return l, nil
}

func (p *jParser) parseUnary(withFilter bool) (jExpr, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > jMaxNesting {
		return nil, p.fail("expression nesting too deep")
	}
	var e jExpr
	var err error
	switch {
	case p.isOp("-"):
		p.next()
		inner, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		e = &jeNeg{e: inner}
	case p.isOp("+"):
		p.next()
		inner, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		e = &jePos{e: inner}
	default:
		if e, err = p.parsePrimary(); err != nil {
			return nil, err
		}
	}
	if e, err = p.parsePostfix(e); err != nil {
		return nil, err
	}
	if withFilter {
		return p.parseFilterExpr(e)
	}
	return e, nil
}

func (p *jParser) parsePrimary() (jExpr, error) {
	t := p.cur()
	switch t.t {
	case jtName:
		p.next()
		switch t.s {
		case "true", "True":
			return &jeConst{v: jvTrue}, nil
		case "false", "False":
			return &jeConst{v: jvFalse}, nil
		case "none", "None":
			return &jeConst{v: jvNone}, nil
		}
		return &jeName{name: t.s}, nil
	case jtString:
		p.next()
		s := t.s
		for p.cur().t == jtString {
			s += p.next().s
		}
		return &jeConst{v: jStrV(s)}, nil
	case jtInt, jtFloat:
		p.next()
		return &jeConst{v: t.v}, nil
	case jtOp:
		switch t.s {
		case "(":
			p.next()
			e, err := p.parseTuple(false, true, nil, true)
			if err != nil {
				return nil, err
			}
			if err := p.expectOp(")"); err != nil {
				return nil, err
			}
			return e, nil
		case "[":
			return p.parseList()
		case "{":
			return p.parseDict()
		}
	}
	return nil, p.fail("unexpected '%s'", t.describe())
}

func (p *jParser) isTupleEnd(extraEnd []string) bool {
	t := p.cur()
	switch t.t {
	case jtVarEnd, jtBlockEnd:
		return true
	case jtOp:
		return t.s == ")"
	case jtName:
		for _, e := range extraEnd {
			if t.s == e {
				return true
			}
		}
	case jtEOF:
		return true
	}
	return false
}

// parseTuple mirrors Parser.parse_tuple.
func (p *jParser) parseTuple(simplified, withCondExpr bool, extraEnd []string, explicitParens bool) (jExpr, error) {
	var items []jExpr
	isTuple := false
	for {
		if len(items) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		if p.isTupleEnd(extraEnd) {
			break
		}
		var e jExpr
		var err error
		switch {
		case simplified:
			e, err = p.parsePrimary()
		default:
			e, err = p.parseExpression(withCondExpr)
		}
		if err != nil {
			return nil, err
		}
		items = append(items, e)
		if p.isOp(",") {
			isTuple = true
		} else {
			break
		}
	}
	if !isTuple {
		if len(items) > 0 {
			return items[0], nil
		}
		if !explicitParens {
			return nil, p.fail("Expected an expression, got '%s'", p.cur().describe())
		}
	}
	return &jeTuple{items: items}, nil
}

func (p *jParser) parseList() (jExpr, error) {
	p.next() // [
	l := &jeList{}
	for !p.isOp("]") {
		if len(l.items) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		if p.isOp("]") {
			break
		}
		e, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		l.items = append(l.items, e)
	}
	p.next()
	return l, nil
}

func (p *jParser) parseDict() (jExpr, error) {
	p.next() // {
	d := &jeDict{}
	for !p.isOp("}") {
		if len(d.keys) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		if p.isOp("}") {
			break
		}
		k, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		if err := p.expectOp(":"); err != nil {
			return nil, err
		}
		v, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		d.keys = append(d.keys, k)
		d.vals = append(d.vals, v)
	}
	p.next()
	return d, nil
}

func (p *jParser) parsePostfix(e jExpr) (jExpr, error) {
	for {
		var err error
		switch {
		case p.isOp(".") || p.isOp("["):
			e, err = p.parseSubscript(e)
		case p.isOp("("):
			e, err = p.parseCall(e)
		default:
			return e, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (p *jParser) parseFilterExpr(e jExpr) (jExpr, error) {
	for {
		var err error
		switch {
		case p.isOp("|"):
			e, err = p.parseFilter(e, false)
		case p.isName("is"):
			e, err = p.parseTest(e)
		case p.isOp("("):
			e, err = p.parseCall(e)
		default:
			return e, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (p *jParser) parseSubscript(e jExpr) (jExpr, error) {
	t := p.next()
	if t.s == "." {
		a := p.cur()
		p.next()
		switch a.t {
		case jtName:
			return &jeGetattr{obj: e, name: a.s}, nil
		case jtInt:
			return &jeGetitem{obj: e, key: &jeConst{v: a.v}}, nil
		}
		return nil, p.fail("expected name or number")
	}
	// [
	var args []jExpr
	for !p.isOp("]") {
		if len(args) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		a, err := p.parseSubscribed()
		if err != nil {
			return nil, err
		}
		args = append(args, a)
	}
	p.next()
	switch len(args) {
	case 0:
		return nil, p.fail("expected subscript expression")
	case 1:
		return &jeGetitem{obj: e, key: args[0]}, nil
	}
	return &jeGetitem{obj: e, key: &jeTuple{items: args}}, nil
}

func (p *jParser) parseSubscribed() (jExpr, error) {
	var args []jExpr
	if p.isOp(":") {
		p.next()
		args = []jExpr{nil}
	} else {
		e, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		if !p.isOp(":") {
			return e, nil
		}
		p.next()
		args = []jExpr{e}
	}
	switch {
	case p.isOp(":"):
		args = append(args, nil)
	case !p.isOp("]") && !p.isOp(","):
		e, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		args = append(args, e)
	default:
		args = append(args, nil)
	}
	if p.skipOp(":") {
		if !p.isOp("]") && !p.isOp(",") {
			e, err := p.parseExpression(true)
			if err != nil {
				return nil, err
			}
			args = append(args, e)
		} else {
			args = append(args, nil)
		}
	} else {
		args = append(args, nil)
	}
	return &jeSlice{start: args[0], stop: args[1], step: args[2]}, nil
}

func (p *jParser) parseCallArgs() (jArgs, error) {
	var a jArgs
	if err := p.expectOp("("); err != nil {
		return a, err
	}
	requireComma := false
	for !p.isOp(")") {
		if requireComma {
			if err := p.expectOp(","); err != nil {
				return a, err
			}
			if p.isOp(")") {
				break
			}
		}
		switch {
		case p.isOp("*"):
			if a.dynArgs != nil || a.dynKw != nil {
				return a, p.fail("invalid syntax for function call expression")
			}
			p.next()
			e, err := p.parseExpression(true)
			if err != nil {
				return a, err
			}
			a.dynArgs = e
		case p.isOp("**"):
			if a.dynKw != nil {
				return a, p.fail("invalid syntax for function call expression")
			}
			p.next()
			e, err := p.parseExpression(true)
			if err != nil {
				return a, err
			}
			a.dynKw = e
		case p.cur().t == jtName && p.look().t == jtOp && p.look().s == "=":
			if a.dynKw != nil {
				return a, p.fail("invalid syntax for function call expression")
			}
			key := p.next().s
			p.next()
			e, err := p.parseExpression(true)
			if err != nil {
				return a, err
			}
			a.kwNames = append(a.kwNames, key)
			a.kwVals = append(a.kwVals, e)
		default:
			if a.dynArgs != nil || a.dynKw != nil || len(a.kwNames) > 0 {
				return a, p.fail("invalid syntax for function call expression")
			}
			e, err := p.parseExpression(true)
			if err != nil {
				return a, err
			}
			a.pos = append(a.pos, e)
		}
		requireComma = true
	}
	p.next()
	return a, nil
}

func (p *jParser) parseCall(e jExpr) (jExpr, error) {
	args, err := p.parseCallArgs()
	if err != nil {
		return nil, err
	}
	return &jeCall{fn: e, args: args}, nil
}

// parseFilter parses "| name(args) | ..." (startInline: the first "|" is absent).
func (p *jParser) parseFilter(e jExpr, startInline bool) (jExpr, error) {
	for p.isOp("|") || startInline {
		if !startInline {
			p.next()
		}
		startInline = false
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		for p.skipOp(".") {
			n, err := p.expectName()
			if err != nil {
				return nil, err
			}
			name += "." + n
		}
		var args jArgs
		if p.isOp("(") {
			if args, err = p.parseCallArgs(); err != nil {
				return nil, err
			}
		}
		fn := jFilters[name]
		if fn == nil && p.soft == 0 {
			return nil, p.fail("No filter named '%s'.", name)
		}
		e = &jeFilter{e: e, name: name, fn: fn, args: args}
	}
	return e, nil
}

func (p *jParser) parseTest(e jExpr) (jExpr, error) {
	p.next() // is
	negated := p.skipName("not")
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	for p.skipOp(".") {
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		name += "." + n
	}
	var args jArgs
	t := p.cur()
	switch {
	case p.isOp("("):
		if args, err = p.parseCallArgs(); err != nil {
			return nil, err
		}
	case (t.t == jtName || t.t == jtString || t.t == jtInt || t.t == jtFloat || (t.t == jtOp && (t.s == "(" || t.s == "[" || t.s == "{"))) &&
		!(t.t == jtName && (t.s == "else" || t.s == "or" || t.s == "and")):
		if t.t == jtName && t.s == "is" {
			return nil, p.fail("You cannot chain multiple tests with is")
		}
		a, err := p.parsePrimary()
		if err != nil {
			return nil, err
		}
		if a, err = p.parsePostfix(a); err != nil {
			return nil, err
		}
		args.pos = []jExpr{a}
	}
	fn := jTests[name]
	if fn == nil && p.soft == 0 {
		return nil, p.fail("No test named '%s'.", name)
	}
	var out jExpr = &jeTest{e: e, name: name, fn: fn, args: args}
	if negated {
		out = &jeNot{e: out}
	}
	return out, nil
}

// ---- walking ----

// jWalkStmts visits statements in jinja2's find_all order (pre-order, fields in
// declaration order); fn returns false to stop descending.
func jWalkStmts(body []jNode, fn func(jNode) bool) {
	for _, n := range body {
		if !fn(n) {
			continue
		}
		switch x := n.(type) {
		case *jnIf:
			for i := range x.tests {
				jWalkStmts(x.bodies[i], fn)
			}
			jWalkStmts(x.els, fn)
		case *jnFor:
			jWalkStmts(x.body, fn)
			jWalkStmts(x.els, fn)
		case *jnSetBlock:
			jWalkStmts(x.body, fn)
		case *jnMacro:
			jWalkStmts(x.m.body, fn)
		case *jnCallBlock:
			jWalkStmts(x.caller.body, fn)
		case *jnFilterBlock:
			jWalkStmts(x.body, fn)
		case *jnWith:
			jWalkStmts(x.body, fn)
		case *jnBlock:
			jWalkStmts(x.body, fn)
		case *jnGeneration:
			jWalkStmts(x.body, fn)
		}
	}
}

// jWalkExprsInStmts visits every expression of the statements (not descending into
// nested macro definitions' own flags, which is what jinja2's find_undeclared does).
func jWalkExprsInStmts(body []jNode, fn func(jExpr)) {
	jWalkStmts(body, func(n jNode) bool {
		switch x := n.(type) {
		case *jnOutput:
			jWalkExpr(x.e, fn)
		case *jnIf:
			for _, t := range x.tests {
				jWalkExpr(t, fn)
			}
		case *jnFor:
			jWalkExpr(x.iter, fn)
			jWalkExpr(x.cond, fn)
		case *jnSet:
			jWalkExpr(x.e, fn)
		case *jnSetBlock:
			jWalkExpr(x.filter, fn)
		case *jnCallBlock:
			jWalkExpr(x.call, fn)
		case *jnFilterBlock:
			jWalkExpr(x.filter, fn)
		case *jnWith:
			for _, v := range x.vals {
				jWalkExpr(v, fn)
			}
		case *jnMacro:
			for _, d := range x.m.defaults {
				jWalkExpr(d, fn)
			}
			return false
		}
		return true
	})
}

func jWalkExpr(e jExpr, fn func(jExpr)) {
	if e == nil {
		return
	}
	fn(e)
	walkArgs := func(a *jArgs) {
		for _, x := range a.pos {
			jWalkExpr(x, fn)
		}
		for _, x := range a.kwVals {
			jWalkExpr(x, fn)
		}
		jWalkExpr(a.dynArgs, fn)
		jWalkExpr(a.dynKw, fn)
	}
	switch x := e.(type) {
	case *jeGetattr:
		jWalkExpr(x.obj, fn)
	case *jeGetitem:
		jWalkExpr(x.obj, fn)
		jWalkExpr(x.key, fn)
	case *jeSlice:
		jWalkExpr(x.start, fn)
		jWalkExpr(x.stop, fn)
		jWalkExpr(x.step, fn)
	case *jeCall:
		jWalkExpr(x.fn, fn)
		walkArgs(&x.args)
	case *jeFilter:
		jWalkExpr(x.e, fn)
		walkArgs(&x.args)
	case *jeTest:
		jWalkExpr(x.e, fn)
		walkArgs(&x.args)
	case *jeNot:
		jWalkExpr(x.e, fn)
	case *jeNeg:
		jWalkExpr(x.e, fn)
	case *jePos:
		jWalkExpr(x.e, fn)
	case *jeBin:
		jWalkExpr(x.l, fn)
		jWalkExpr(x.r, fn)
	case *jeAnd:
		jWalkExpr(x.l, fn)
		jWalkExpr(x.r, fn)
	case *jeOr:
		jWalkExpr(x.l, fn)
		jWalkExpr(x.r, fn)
	case *jeCompare:
		jWalkExpr(x.first, fn)
		for _, r := range x.rest {
			jWalkExpr(r, fn)
		}
	case *jeConcat:
		for _, a := range x.args {
			jWalkExpr(a, fn)
		}
	case *jeCond:
		jWalkExpr(x.test, fn)
		jWalkExpr(x.yes, fn)
		jWalkExpr(x.no, fn)
	case *jeList:
		for _, a := range x.items {
			jWalkExpr(a, fn)
		}
	case *jeTuple:
		for _, a := range x.items {
			jWalkExpr(a, fn)
		}
	case *jeDict:
		for i := range x.keys {
			jWalkExpr(x.keys[i], fn)
			jWalkExpr(x.vals[i], fn)
		}
	}
}
