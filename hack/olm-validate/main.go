// Command olm-validate checks an OLM registry+v1 bundle directory with operator-framework's
// own validation, the checks `operator-sdk bundle validate DIR --select-optional
// suite=operatorframework` runs, without a container tool:
//
//   - the bundle format (operator-registry: manifests/ and metadata/, annotations.yaml
//     labels, media type) and content (every manifest an OLM-supported kind that
//     decodes, the CSV and CRDs valid);
//   - the default validators of github.com/operator-framework/api (CSV, CRDs, bundle);
//   - the optional "operatorframework" suite: OperatorHub metadata (v2, capabilities,
//     categories), deprecated APIs for the given Kubernetes version, good practices,
//     and the object validator (PodDisruptionBudgets and the like).
//
// Usage: olm-validate [-k8s-version 1.27] [-strict] BUNDLE_DIR
//
// Exit status 1 on any error, or on any warning with -strict; each finding is one
// line "ERROR|WARN <validator> <object>: <message>".
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	apimanifests "github.com/operator-framework/api/pkg/manifests"
	apivalidation "github.com/operator-framework/api/pkg/validation"
	apierrors "github.com/operator-framework/api/pkg/validation/errors"
	registrybundle "github.com/operator-framework/operator-registry/pkg/lib/bundle"
	"github.com/sirupsen/logrus"
)

func main() {
	k8sVersion := flag.String("k8s-version", "", "Kubernetes version the bundle must install on (deprecated-API check)")
	strict := flag.Bool("strict", false, "fail on warnings too")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: olm-validate [-k8s-version X.Y] [-strict] BUNDLE_DIR")
		os.Exit(2)
	}
	dir := flag.Arg(0)
	errs, warns := 0, 0
	report := func(level, validator, object, message string) {
		fmt.Printf("%s %s %s: %s\n", level, validator, object, message)
		if level == "ERROR" {
			errs++
		} else {
			warns++
		}
	}

	logger := logrus.New()
	logger.SetOutput(io.Discard)
	registry := registrybundle.NewImageValidator(nil, logrus.NewEntry(logger))
	if err := registry.ValidateBundleFormat(dir); err != nil {
		report("ERROR", "bundle-format", dir, err.Error())
	}
	if err := registry.ValidateBundleContent(filepath.Join(dir, "manifests")); err != nil {
		report("ERROR", "bundle-content", filepath.Join(dir, "manifests"), err.Error())
	}

	bundle, err := apimanifests.GetBundleFromDir(filepath.Join(dir, "manifests"))
	if err != nil {
		report("ERROR", "load", dir, err.Error())
		os.Exit(1)
	}
	objs := bundle.ObjectsToValidate()
	for _, obj := range bundle.Objects {
		objs = append(objs, obj)
	}
	optional := map[string]string{}
	if *k8sVersion != "" {
		optional["k8s-version"] = *k8sVersion
	}
	objs = append(objs, optional)

	validators := apivalidation.DefaultBundleValidators.WithValidators(
		apivalidation.OperatorHubV2Validator,
		apivalidation.StandardCapabilitiesValidator,
		apivalidation.StandardCategoriesValidator,
		apivalidation.AlphaDeprecatedAPIsValidator,
		apivalidation.GoodPracticesValidator,
		apivalidation.ObjectValidator,
	)
	for _, result := range validators.Validate(objs...) {
		printResult(result, report)
	}

	fmt.Printf("%s: %d error(s), %d warning(s) (operator-framework/api default validators + operatorframework suite)\n", dir, errs, warns)
	if errs > 0 || (*strict && warns > 0) {
		os.Exit(1)
	}
}

func printResult(result apierrors.ManifestResult, report func(level, validator, object, message string)) {
	for _, e := range result.Errors {
		report("ERROR", result.Name, describe(e), e.Error())
	}
	for _, w := range result.Warnings {
		report("WARN", result.Name, describe(w), w.Error())
	}
}

func describe(e apierrors.Error) string {
	if e.Field != "" {
		return e.Field
	}
	return "-"
}
