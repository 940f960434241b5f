// Package kubeapi: the API server as an operand's pod reaches it, for the TEST DOUBLES.
package kubeapi

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// serviceAccount is where a pod finds its API credentials.
const serviceAccount = "/var/run/secrets/kubernetes.io/serviceaccount"

// Client: the API server as a pod reaches it (in-cluster), with the pod's service account, as
// client-go's in-cluster config does: the RBAC the operator gives the operand is what it has.
type Client struct {
	Base, Token string
	HTTP        *http.Client
}

// InCluster: the client of the pod this runs in.
func InCluster() (*Client, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, fmt.Errorf("not in a pod: KUBERNETES_SERVICE_HOST/PORT are not set")
	}
	token, err := os.ReadFile(serviceAccount + "/token")
	if err != nil {
		return nil, fmt.Errorf("no service account token: %w", err)
	}
	ca, err := os.ReadFile(serviceAccount + "/ca.crt")
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s/ca.crt holds no certificate", serviceAccount)
	}
	return &Client{Base: "https://" + net.JoinHostPort(host, port), Token: string(bytes.TrimSpace(token)),
		HTTP: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}}, nil
}

// Do sends body (JSON) and decodes the answer into out; it returns the HTTP status (404 is
// no error: the caller reads the status).
func (k *Client) Do(method, path string, body, out any) (int, error) {
	return k.send(method, path, "application/json", body, out)
}

// MergePatch: a JSON merge patch of the object at path (as client-go's MergePatchType).
func (k *Client) MergePatch(path string, patch any) error {
	_, err := k.send("PATCH", path, "application/merge-patch+json", patch, nil)
	return err
}

func (k *Client) send(method, path, contentType string, body, out any) (int, error) {
	var reader io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		reader = bytes.NewReader(data)
	}
	request, err := http.NewRequest(method, k.Base+path, reader)
	if err != nil {
		return 0, err
	}
	request.Header.Set("Authorization", "Bearer "+k.Token)
	request.Header.Set("Content-Type", contentType)
	request.Header.Set("Accept", "application/json")
	response, err := k.HTTP.Do(request)
	if err != nil {
		return 0, err
	}
	defer response.Body.Close()
	data, err := io.ReadAll(response.Body)
	if err != nil {
		return response.StatusCode, err
	}
	if response.StatusCode >= 300 {
		if response.StatusCode == http.StatusNotFound {
			return response.StatusCode, nil
		}
		return response.StatusCode, fmt.Errorf("%s %s: %s: %s", method, path, response.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		return response.StatusCode, json.Unmarshal(data, out)
	}
	return response.StatusCode, nil
}
