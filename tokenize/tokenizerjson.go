package tokenize

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// TokenizerJSONPath returns the path of dir's tokenizer: dir/tokenizer.json, or
// dir/tokenizer.json.gz when only that exists. The error (one wrapping
// fs.ErrNotExist when neither exists) names the paths tried.
func TokenizerJSONPath(dir string) (string, error) {
	path := filepath.Join(dir, "tokenizer.json")
	_, err := os.Stat(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return path, err
	}
	gz := path + ".gz"
	if _, gzErr := os.Stat(gz); gzErr == nil {
		return gz, nil
	} else if !errors.Is(gzErr, fs.ErrNotExist) {
		return gz, gzErr
	}
	return path, fmt.Errorf("%w (nor %s)", err, gz)
}

// ReadTokenizerJSON returns the contents of dir/tokenizer.json, or of
// dir/tokenizer.json.gz decompressed when tokenizer.json does not exist, and the
// path read. Errors name the path.
func ReadTokenizerJSON(dir string) (data []byte, path string, err error) {
	path, err = TokenizerJSONPath(dir)
	if err != nil {
		return nil, path, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, path, err
	}
	defer f.Close()
	if filepath.Ext(path) != ".gz" {
		data, err = io.ReadAll(f)
		if err != nil {
			return nil, path, fmt.Errorf("%s: %w", path, err)
		}
		return data, path, nil
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, path, fmt.Errorf("%s: %w", path, err)
	}
	data, err = io.ReadAll(zr)
	if err == nil {
		err = zr.Close()
	}
	if err != nil {
		return nil, path, fmt.Errorf("%s: %w", path, err)
	}
	return data, path, nil
}
